"""The exporters' C and CMake text: template files beside this module (``*.c.in``,
``*.cmake.in``, package data), each filled by ``fill``.

A template names its fields ``@{name}``: the C and CMake around them use ``{}`` and ``${}``
freely, and neither language writes ``@`` (``@@`` is a literal one)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from string import Template


class _Fields(Template):
    delimiter = "@"


@cache
def _template(name: str) -> _Fields:
    return _Fields(files(__package__).joinpath(name).read_text())


def text(template: str) -> str:
    """The file ``template`` as it is (one without fields)."""
    return fill(template)


def fill(template: str, /, **fields: object) -> str:
    """The file ``template`` with each ``@{field}`` replaced by ``str`` of its value; a KeyError
    names a field left out, a ValueError one the template does not have."""
    t = _template(template)
    extra = fields.keys() - set(t.get_identifiers())
    if extra:
        raise ValueError(f"{template} has no field {', '.join(sorted(extra))}")
    return t.substitute(fields)
