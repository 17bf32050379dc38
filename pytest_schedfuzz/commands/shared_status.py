"""``schedfuzz campaign status``: a campaign shared on Redis (``campaign.shared``), as it stands."""

from __future__ import annotations

import argparse
import time

from ..campaign.shared import SharedError
from ..campaign.shared import status as campaign_status
from . import UsageError, cli_words


def status(args: argparse.Namespace) -> int:
    try:
        found = campaign_status(args.db, args.db_ca)
    except SharedError as e:
        raise UsageError(cli_words(e)) from None
    print("\n".join(found.lines(time.time())))
    return 0
