"""The layout's rules (``docs/design.md`` §12), read from the sources: the data package
imports nothing of the project's, the oracle imports only the data package, and no private name
is imported from another package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_schedfuzz"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, names) of every ``from X import`` in ``path``."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1])  # the package the module is in (for __init__: the package itself)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def _ours(module: str) -> bool:
    return module == "pytest_schedfuzz" or module.startswith(("pytest_schedfuzz.", "reference"))


def test_the_data_package_imports_nothing_of_the_project_but_itself() -> None:
    for path in (PACKAGE / "model").glob("*.py"):
        for module, _ in _imports(path):
            assert not _ours(module) or module.startswith("pytest_schedfuzz.model"), f"{path.name} imports {module}"


def test_the_reference_imports_only_the_data_package() -> None:
    """... and, in its ``__init__`` alone, the loader of its compiled modules, which imports
    nothing of the project's but where the cache is."""
    for path in (ROOT / "reference").glob("*.py"):
        loader = ("pytest_schedfuzz.compiled",) if path.name == "__init__.py" else ()
        for module, _ in _imports(path):
            assert not _ours(module) or module.startswith(("reference", "pytest_schedfuzz.model", *loader)), f"reference/{path.name} imports {module}"
    for module, _ in _imports(PACKAGE / "compiled.py"):
        assert not _ours(module) or module == "pytest_schedfuzz.files", f"compiled.py imports {module}"


def test_no_private_name_is_imported_from_another_package() -> None:
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]:
        own = ".".join(path.relative_to(ROOT).parts[:-1])
        for module, names in _imports(path):
            if _ours(module) and not module.startswith(own + ".") and module != own:
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {module}"


def test_no_engine_module_imports_the_reference() -> None:
    """The engines report raw observations; what is derived from them is computed on the judging
    side (``properties.derived``)."""
    for engine in ("ggml", "llama"):
        for path in (PACKAGE / engine).glob("*.py"):
            for module, _ in _imports(path):
                assert not module.startswith("reference"), f"{engine}/{path.name} imports {module}"


def test_the_plugin_imports_nothing_of_the_project_without_the_flag() -> None:
    """pytest loads ``plugin.py`` in every session of a project that installs schedfuzz: its own
    imports (those not inside a hook) are pytest's and the standard library's only."""
    tree = ast.parse((PACKAGE / "plugin.py").read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in top:
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        assert node.level == 0 if isinstance(node, ast.ImportFrom) else True, f"plugin.py imports .{module} at load time"
        assert not _ours(module or ""), f"plugin.py imports {module} at load time"


def _call_kind_tables(source: str, where: str) -> list[str]:
    """Places in ``source`` that branch or key on three or more llama.cpp call kinds: an if/elif
    chain comparing a kind with them, or a dict literal keyed by them. Each kind is one entry of
    ``model.llama_calls.CALLS``, and such a place is a second table of kinds."""
    from pytest_schedfuzz.model.llama_calls import CALL_KINDS

    def kinds(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in CALL_KINDS}

    out = []
    tree = ast.parse(source)
    elifs = {id(n.orelse[0]) for n in ast.walk(tree) if isinstance(n, ast.If) and len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If)}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and id(node) not in elifs:
            seen, branch = set(), node
            while True:
                seen |= kinds(branch.test) if isinstance(branch.test, ast.Compare) else set()
                if not (len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If)):
                    break
                branch = branch.orelse[0]
            if len(seen) >= 3:
                out.append(f"{where}:{node.lineno}: an if/elif over the call kinds {sorted(seen)}")
        elif isinstance(node, ast.Dict) and len({k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in CALL_KINDS}) >= 3:
            out.append(f"{where}:{node.lineno}: a dict keyed by call kinds")
    return out


def test_call_kinds_are_branched_on_only_in_their_table() -> None:
    """A llama.cpp call kind is one entry of ``CALLS``: no module branches or keys on the kinds
    (the server strategy, which draws them, aside); a planted dispatch chain is caught."""
    planted = 'def make(k):\n    if k == "seq_rm":\n        pass\n    elif k == "seq_cp":\n        pass\n    elif k in ("clear", "shift"):\n        pass\n'
    assert len(_call_kind_tables(planted, "planted")) == 1
    assert len(_call_kind_tables('X = {"seq_rm": 1, "seq_cp": 2, "clear": 3}\n', "planted")) == 1
    allowed = {PACKAGE / "model" / "llama_calls.py", PACKAGE / "strategies" / "llama.py"}
    found = [x for path in sorted(PACKAGE.rglob("*.py")) if path not in allowed
             for x in _call_kind_tables(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == []


def _family_by_prefix(source: str, where: str) -> list[str]:
    """Places in ``source`` that tell a property's family by its id's prefix (``startswith("llama-")``)
    instead of asking the registry (``properties.is_llama``)."""
    return [f"{where}:{n.lineno}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "startswith"
            and any(isinstance(a, ast.Constant) and a.value == "llama-" for a in n.args)]


def test_a_propertys_family_comes_from_the_registry() -> None:
    """The property ids and every list of them come from ``properties.base.REGISTRY``: no module
    tells a llama property by its prefix, and a planted one is caught."""
    assert _family_by_prefix('if prop.startswith("llama-"):\n    pass\n', "planted") == ["planted:1"]
    found = [x for path in sorted(PACKAGE.rglob("*.py")) for x in _family_by_prefix(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == []
