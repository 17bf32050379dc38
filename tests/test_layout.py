"""The layout's rules (``docs/design.md`` §12), read from the sources: the data package
imports nothing of the project's, the oracle imports only the data package, and no private name
is imported from another package."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
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
    for engine in ("ggml", "llama", "process"):
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


def _kind_tables(source: str, where: str, names: frozenset[str], what: str, literals: bool = False) -> list[str]:
    """Places in ``source`` that branch or key on three or more of ``names`` (the kinds of one
    table): an if/elif chain comparing with them, a dict literal keyed by them, and with
    ``literals`` a tuple, list or set literal of four or more. Each kind is one entry of its
    table, and such a place is a second table of kinds."""

    def kinds(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names}

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
                out.append(f"{where}:{node.lineno}: an if/elif over the {what} {sorted(seen)}")
        elif isinstance(node, ast.Dict) and len({k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names}) >= 3:
            out.append(f"{where}:{node.lineno}: a dict keyed by {what}")
        elif literals and isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
            if len(listed) >= 4:
                out.append(f"{where}:{node.lineno}: a list of the {what} {sorted(listed)}")
    return out


def _places_outside(allowed: set[Path], finder: Callable[[str, str], list[str]]) -> list[str]:
    """``finder``'s places in every module of the package but ``allowed``."""
    return [x for path in sorted(PACKAGE.rglob("*.py")) if path not in allowed for x in finder(path.read_text(), str(path.relative_to(PACKAGE)))]


def _call_kind_tables(source: str, where: str) -> list[str]:
    """``_kind_tables`` of the llama.cpp call kinds (``model.llama_calls.CALLS``)."""
    from pytest_schedfuzz.model.llama_calls import CALL_KINDS

    return _kind_tables(source, where, frozenset(CALL_KINDS), "call kinds")


def _graph_op_tables(source: str, where: str) -> list[str]:
    """``_kind_tables`` of the graph ops (``model.ops.OPS``), literal lists included."""
    from pytest_schedfuzz.model.ops import OPS

    return _kind_tables(source, where, frozenset(OPS), "graph ops", literals=True)


def test_a_graph_op_is_one_entry_of_one_table() -> None:
    """A graph op is one entry of ``model.ops.OPS`` (its shape rule, record, ggml calls, capture):
    no other module lists, keys or branches on the ops, and ``graph.c`` names none (its op C is
    written from the table by ``ggml.graph_ops``); a planted dispatch and a planted list are caught."""
    planted = 'def c(op):\n    if op == "add":\n        pass\n    elif op in ("mul", "div"):\n        pass\n'
    assert len(_graph_op_tables(planted, "planted")) == 1
    assert len(_graph_op_tables('SIMPLE = ("argmax", "sub", "sum", "log")\n', "planted")) == 1
    # the graph strategy's growers (``strategies._GROW``) are named for what they draw, some for an op
    assert _places_outside({PACKAGE / "model" / "ops.py", PACKAGE / "strategies" / "__init__.py"}, _graph_op_tables) == []
    from pytest_schedfuzz.model.ops import OPS

    graph_c = (PACKAGE / "ggml" / "graph.c").read_text()
    assert [op for op in OPS if f"OP_{op}:" in graph_c or f"X(ggml_{op})" in graph_c or f"X({op})" in graph_c] == []


def test_call_kinds_are_branched_on_only_in_their_table() -> None:
    """A llama.cpp call kind is one entry of ``CALLS``: no module branches or keys on the kinds
    (the server strategy, which draws them, aside); a planted dispatch chain is caught."""
    planted = 'def make(k):\n    if k == "seq_rm":\n        pass\n    elif k == "seq_cp":\n        pass\n    elif k in ("clear", "shift"):\n        pass\n'
    assert len(_call_kind_tables(planted, "planted")) == 1
    assert len(_call_kind_tables('X = {"seq_rm": 1, "seq_cp": 2, "clear": 3}\n', "planted")) == 1
    assert _places_outside({PACKAGE / "model" / "llama_calls.py", PACKAGE / "strategies" / "llama_workloads.py"}, _call_kind_tables) == []


def test_every_call_kind_and_draft_action_has_its_worker_method() -> None:
    """A call kind (``CALLS``) and a draft action (``DRAFT_ACTIONS``) are each one table entry with
    its C; the worker's method each names is there, and the draft context's method of each action."""
    from pytest_schedfuzz.llama.llama_worker import Llama
    from pytest_schedfuzz.llama.speculative import DraftContext
    from pytest_schedfuzz.model.llama_calls import CALLS, DRAFT_ACTIONS

    assert [k for k, c in CALLS.items() if not callable(getattr(Llama, c.make, None))] == []
    assert [a for a in DRAFT_ACTIONS if not callable(getattr(DraftContext, a, None))] == []


def _family_by_prefix(source: str, where: str) -> list[str]:
    """Places in ``source`` that tell a property's family by its id's prefix (``startswith("llama-")``)
    instead of asking the registry (``properties.is_llama``)."""
    return [f"{where}:{n.lineno}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "startswith"
            and any(isinstance(a, ast.Constant) and a.value == "llama-" for a in n.args)]


def test_a_propertys_family_comes_from_the_registry() -> None:
    """The property ids and every list of them come from ``properties.registry.REGISTRY``: no module
    tells a llama property by its prefix, and a planted one is caught."""
    assert _family_by_prefix('if prop.startswith("llama-"):\n    pass\n', "planted") == ["planted:1"]
    found = [x for path in sorted(PACKAGE.rglob("*.py")) for x in _family_by_prefix(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == []


def _c_in_strings(source: str, where: str, max_lines: int = 6) -> list[str]:
    """String literals (f-strings included, docstrings aside) of more than ``max_lines`` lines that
    read as C: most of their lines end a statement or a block (``;``, ``{``, ``}``) or are a
    preprocessor line. Such a text is a template file beside its module (``cases/*.c.in``)."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in inner:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        else:
            continue
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        c_like = sum(x.endswith((";", "{", "}")) or x.startswith(("#include", "#if", "#define", "#endif")) for x in lines)
        if len(lines) > max_lines and c_like * 2 > len(lines):
            out.append(f"{where}:{node.lineno}: {len(lines)} lines of C in a string")
    return out


def test_no_c_in_python_strings() -> None:
    """The exporters' C is in template files (``cases/*.in``, filled by ``cases.templates``); a
    planted C function in a string is caught, a short C expression is not."""
    planted = 'X = """static int f(void) {\n    int a = 1;\n    int b = 2;\n    a += b;\n    b += a;\n    return a + b;\n}\n"""\n'
    assert len(_c_in_strings(planted, "planted")) == 1
    assert _c_in_strings('X = f"ggml_add(ctx, {a}, {b});"\n', "planted") == []
    quotes = {PACKAGE / "tools" / "mutants.py"}  # its strings quote ggml's own source: the text a mutant replaces
    found = [x for path in sorted(PACKAGE.rglob("*.py")) if path not in quotes for x in _c_in_strings(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == []


VERSIONS_TABLE = PACKAGE / "model" / "versions.py"


def _version_tests(source: str, where: str) -> list[str]:
    """Places that tell a ggml version by a literal prefix (``version.startswith("0.15.")``)
    instead of asking the versions table (``model.versions.version_of``)."""
    def literal(a: ast.AST) -> list[str]:
        return [e.value for e in (a.elts if isinstance(a, ast.Tuple) else [a]) if isinstance(e, ast.Constant) and isinstance(e.value, str)]

    return [f"{where}:{n.lineno}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "startswith"
            and any(s.startswith("0.") for a in n.args for s in literal(a))]


def test_a_ggml_version_is_told_only_by_the_versions_table() -> None:
    """A ggml version's facts are one entry of ``model/versions.py``: no module outside it tests a
    version's prefix; a planted test is caught."""
    assert _version_tests('new = not version.startswith("0.15.")\n', "planted") == ["planted:1"]
    assert _version_tests('old = v.startswith(("0.14.", "0.15."))\n', "planted") == ["planted:1"]
    found = [x for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]) if path != VERSIONS_TABLE
             for x in _version_tests(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


MAX_MODULE_LINES, MAX_CLASS_LINES = 500, 300
# a class counted with its mixins over the limit, allowed where it is one concept, with the reason;
# each at its size when it was named: it may shrink, never grow
ONE_CONCEPT: dict[str, tuple[int, str]] = {
    "llama/llama_worker.py:Llama": (
        888, "one libllama session: llama.cpp calls back into it (the scheduler hook, the log, the abort: Observation) inside "
             "the calls it makes (Calls), and both read and write the record of the call being made; its devices and models "
             "are a collaborator of their own (Placement)"),
    "llama/observe.py:Observation": (397, "Llama's callbacks, which read each graph they are handed (GraphReading) as it is split"),
    "campaign/fuzz.py:Fuzzer": (
        524, "one fuzzing campaign: its checks (Checks) run inside its Hypothesis examples and judge with its engines, "
             "statistics and the properties it judges"),
    "ggml/scenario_run.py:ScenarioRun": (401, "one scenario's run in the graph worker: each step's record (StepRecording) is made of the run's state"),
}


def _classes(sources: dict[str, str]) -> dict[str, tuple[int, list[str]]]:
    """Every class of ``sources`` (where -> source) as ``where:Name`` -> its own lines and the
    ``where:Name`` of the bases among them (a base named by a class of its own module first)."""
    found: dict[str, tuple[int, list[str]]] = {}
    bases_of: dict[str, list[str]] = {}
    for where, source in sources.items():
        for c in ast.walk(ast.parse(source)):
            if isinstance(c, ast.ClassDef) and c.end_lineno is not None:
                found[f"{where}:{c.name}"] = (c.end_lineno - c.lineno + 1, [])
                bases_of[f"{where}:{c.name}"] = [b.id if isinstance(b, ast.Name) else b.attr for b in c.bases if isinstance(b, (ast.Name, ast.Attribute))]
    by_name: dict[str, list[str]] = {}
    for key in found:
        by_name.setdefault(key.split(":")[1], []).append(key)
    for key, names in bases_of.items():
        where = key.split(":")[0]
        for name in names:
            keys = by_name.get(name, [])
            own = [k for k in keys if k.startswith(f"{where}:")]
            if own or len(keys) == 1:
                found[key][1].append((own or keys)[0])
    return found


def _with_mixins(classes: dict[str, tuple[int, list[str]]], key: str) -> int:
    """A class's lines with those of every base of ours it has, each counted once."""
    seen: set[str] = set()
    todo = [key]
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo += classes[k][1]
    return sum(classes[k][0] for k in seen)


def _too_large(sources: dict[str, str], module_limit: int = MAX_MODULE_LINES, exceptions: dict[str, tuple[int, str]] | None = None) -> list[str]:
    out = [f"{where}: {len(s.splitlines())} lines (at most {module_limit})" for where, s in sources.items() if len(s.splitlines()) > module_limit]
    classes = _classes(sources)
    for key in classes:
        size, limit = _with_mixins(classes, key), (exceptions or {}).get(key, (MAX_CLASS_LINES, ""))[0]
        if size > limit:
            out.append(f"{key}: {size} lines with its mixins (at most {limit})")
    return out


def test_no_module_over_500_lines_nor_class_over_300_with_its_mixins() -> None:
    """A class counts with its mixins; one over the limit is a named concept (``ONE_CONCEPT``, each
    with its reason) and may not grow. A planted module, class and class split into mixins over
    the limits are caught."""
    planted = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES
    assert _too_large({"planted.py": planted}) == [f"planted.py:Big: {MAX_CLASS_LINES + 1} lines with its mixins (at most {MAX_CLASS_LINES})"]
    half = "    x = 1\n" * (MAX_CLASS_LINES // 2)
    split = {"a.py": "class Part:\n" + half, "b.py": "from a import Part\nclass Whole(Part):\n" + half}
    assert _too_large(split) == [f"b.py:Whole: {MAX_CLASS_LINES + 2} lines with its mixins (at most {MAX_CLASS_LINES})"]
    assert _too_large({"planted.py": "x = 1\n" * (MAX_MODULE_LINES + 1)}) == [f"planted.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})"]
    sources = {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}
    assert _too_large(sources, exceptions=ONE_CONCEPT) == []
    assert all(reason for _, reason in ONE_CONCEPT.values()) and set(ONE_CONCEPT) <= set(_classes(sources))


def _import_cycles(modules: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """The import cycles among ``modules`` (name -> (source, is a package's ``__init__``)): every
    import counts, at module level or inside a function, but those for type checking alone
    (``if TYPE_CHECKING:``) do not; each cycle as its modules, sorted."""
    graph: dict[str, set[str]] = {}
    for name, (source, package) in modules.items():
        here = name.split(".") if package else name.split(".")[:-1]
        tree = ast.parse(source)
        typing_only = {id(n) for t in ast.walk(tree) if isinstance(t, ast.If) and isinstance(t.test, ast.Name) and t.test.id == "TYPE_CHECKING"
                       for b in t.body for n in ast.walk(b)}
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = ".".join((here[: len(here) - node.level + 1] if node.level else []) + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    # Tarjan's strongly connected components: a component of more than one module is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


# none left: plugin imports session inside a hook, and session nothing of plugin
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles_at_module_or_function_level() -> None:
    """No module imports, directly or through others, one that imports it, whether at load time or
    inside a function (the ``lib`` <-> ``build`` cycle was one); a planted function-level cycle is
    caught, and a type-checking import is no cycle."""
    planted = {"p": ("", True), "p.a": ("from . import b\n", False), "p.b": ("def f():\n    from .a import x\n", False),
               "p.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import y\n", False), "p.d": ("from .c import z\n", False)}
    assert _import_cycles(planted) == [["p.a", "p.b"]]
    modules = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path.read_text(), package)
    assert _import_cycles(modules) == KNOWN_CYCLES


DEVICES_TABLE = PACKAGE / "model" / "devices.py"


def _device_kind_tests(source: str, where: str) -> list[str]:
    """Places in ``source`` that compare something with a device kind's name (``b.kind == "gpu"``,
    ``kind in ("rpc", "gpu")``) or key a dict literal by two or more of them, instead of asking the
    kind's entry (``BackendSpec.device``: ``model.devices.DEVICE_KINDS``). Naming a kind to make a
    backend (``BackendSpec("rpc")``) is no test."""
    from pytest_schedfuzz.model.devices import BACKEND_KINDS

    def names(node: ast.AST) -> set[str]:
        items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return {e.value for e in items if isinstance(e, ast.Constant) and e.value in BACKEND_KINDS}

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            found = set().union(*(names(x) for x in (node.left, *node.comparators)))
            if found:
                out.append(f"{where}:{node.lineno}: compares with the device kind(s) {sorted(found)}")
        elif isinstance(node, ast.Dict) and len({k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in BACKEND_KINDS}) >= 2:
            out.append(f"{where}:{node.lineno}: a dict keyed by device kinds")
    return out


def test_device_kinds_are_told_only_by_their_table() -> None:
    """A device kind is one entry of ``model.devices.DEVICE_KINDS``: no module compares a kind with
    its name or keys a table by the names, but the engine's constructors and the strategies' draws
    (their halves of each entry, which the data package cannot import), checked here to cover the
    table exactly; a planted
    comparison, membership test and table are caught, a backend made by its kind's name is not."""
    assert _device_kind_tests('if b.kind == "gpu":\n    pass\n', "planted") == ["planted:1: compares with the device kind(s) ['gpu']"]
    assert len(_device_kind_tests('own = spec.kind in ("rpc", "gpu")\n', "planted")) == 1
    assert len(_device_kind_tests('X = {"rpc": 1, "cpu": 2}\n', "planted")) == 1
    assert _device_kind_tests('layout = BackendLayout.of("rpc", "cpu")\nspec = BackendSpec("gpu")\n', "planted") == []
    from pytest_schedfuzz.ggml.constructors import CONSTRUCTORS
    from pytest_schedfuzz.model.devices import DEVICE_KINDS
    from pytest_schedfuzz.strategies import LAYOUT_DRAWS

    assert list(CONSTRUCTORS) == list(DEVICE_KINDS)
    # the strategies' half: every kind but the host, in the order a layout holds them (GPU-like devices first)
    assert sorted(LAYOUT_DRAWS) == sorted(k.name for k in DEVICE_KINDS.values() if not k.host)
    halves = {str(p.relative_to(ROOT)) for p in (PACKAGE / "ggml" / "constructors.py", PACKAGE / "strategies" / "__init__.py")}
    found = [x for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]) if path != DEVICES_TABLE
             for x in _device_kind_tests(path.read_text(), str(path.relative_to(ROOT)))]
    assert [x for x in found if not (x.split(":")[0] in halves and "dict keyed" in x)] == []


def test_every_exported_device_kind_has_its_c_constructor() -> None:
    """Each kind's ``exported`` C calls a constructor the reproducer's templates define."""
    import re

    from pytest_schedfuzz.model.devices import DEVICE_KINDS

    templates = "".join(p.read_text() for p in (PACKAGE / "cases").glob("repro*.c.in"))
    for kind in DEVICE_KINDS.values():
        if kind.exported is not None:
            called = re.match(r"(\w+)\(", kind.exported)
            assert called and re.search(rf"^static ggml_backend_t {called.group(1)}\(", templates, re.M), kind


def _built_ins_named(text: str) -> dict[str, set[str]]:
    """The names ``text`` gives ``--schedfuzz-lib`` and ``--schedfuzz-llama-lib`` (``=NAME``,
    `` NAME``, or a table's ``NAME\\|NAME\\|DIR``) that read as a built-in's (``ggml-…``, ``llama.cpp-…``)."""
    import re

    out: dict[str, set[str]] = {"lib": set(), "llama-lib": set()}
    for option, value in re.findall(r"--schedfuzz-(lib|llama-lib)[= ]([^\s`]+)", text):
        out[option] |= {v for v in value.replace("\\|", "|").split("|") if v.startswith(("ggml-", "llama.cpp-"))}
    return out


def test_the_built_ins_named_by_ci_and_docs_are_the_tables() -> None:
    """``.ci/run``, the README and the docs write built-ins' names by hand: each must be one of
    ``model.versions.BUILT_IN`` (or the seeds' ggml) and ``builds.names.BUILT_IN`` (or a published
    build: ``llama.cpp-bNNNN``, the form too), so none goes stale when a version changes; a planted
    stale name is caught."""
    from pytest_schedfuzz.builds.names import BUILT_IN as LLAMA_BUILT_IN
    from pytest_schedfuzz.builds.names import SEED_GGML, is_published
    from pytest_schedfuzz.model.versions import BUILT_IN

    known = {"lib": {*BUILT_IN, SEED_GGML}, "llama-lib": set(LLAMA_BUILT_IN)}
    planted = _built_ins_named("pytest --schedfuzz-lib=ggml-0.14.0 -q\n| `--schedfuzz-llama-lib llama.cpp-0.3.36\\|llama.cpp-0.3.35\\|DIR` |")
    assert planted == {"lib": {"ggml-0.14.0"}, "llama-lib": {"llama.cpp-0.3.36", "llama.cpp-0.3.35"}}
    assert {k: v - known[k] for k, v in planted.items()} == {"lib": {"ggml-0.14.0"}, "llama-lib": {"llama.cpp-0.3.35"}}
    named = [(path.name, _built_ins_named(path.read_text())) for path in [ROOT / ".ci" / "run", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    assert {k for _, n in named for k, v in n.items() if v} == {"lib", "llama-lib"}  # the scan reads .ci/run's and the docs' names
    published = {v for _, n in named for v in n.get("llama-lib", ()) if is_published(v) or v == "llama.cpp-bNNNN"}
    stale = [(name, k, sorted(v - known[k] - published)) for name, n in named for k, v in n.items() if v - known[k] - published]
    assert stale == []


def _property_id_tables(source: str, where: str, ids: set[str]) -> list[str]:
    """Places in ``source`` that list property ids: a dict literal keyed by one (a table of its
    own per property), or a tuple, list or set literal of two or more (a list of ids written by
    hand). Each property is one entry of ``properties.registry.REGISTRY``, declared in its own
    module, and every list of ids is a view of it; one id compared or named alone is no list."""
    def named(items: list[ast.expr | None]) -> list[str]:
        return [e.value for e in items if isinstance(e, ast.Constant) and e.value in ids]

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and named(node.keys):
            out.append(f"{where}:{node.lineno}: a dict keyed by the property ids {named(node.keys)}")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(named(node.elts)) >= 2:
            out.append(f"{where}:{node.lineno}: a list of the property ids {named(node.elts)}")
    return out


def _entries_declared(source: str, where: str, ids: set[str]) -> dict[str, list[str]]:
    """id -> where ``source`` declares a property's entry (``PropertyEntry("id", ...)``)."""
    out: dict[str, list[str]] = {}
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "PropertyEntry" and n.args:
            first = n.args[0]
            if isinstance(first, ast.Constant) and first.value in ids:
                out.setdefault(first.value, []).append(f"{where}:{n.lineno}")
    return out


def test_a_property_is_one_entry_in_its_module() -> None:
    """A property is one ``PropertyEntry`` (id, docs text, needs, draws, judge, export), declared
    in the module that holds its judge; ``REGISTRY`` collects them, and no module lists ids by
    hand (``PROPERTIES``, ``LLAMA_CHECKS``, the id lists, what the exporters show are views of the
    registry); a planted table, list and second declaration are caught."""
    from pytest_schedfuzz.properties.registry import REGISTRY

    ids = {p.id for p in REGISTRY}
    assert len(_property_id_tables('SHOWN = {"no-abort": "ggml aborts"}\n', "planted", ids)) == 1
    assert len(_property_id_tables('if p in ("same-values", "no-abort"):\n    pass\n', "planted", ids)) == 1
    assert _property_id_tables('if p == "no-abort":\n    pass\nV = Violation("no-abort", 0, "x")\n', "planted", ids) == []
    found = [x for path in sorted(PACKAGE.rglob("*.py")) for x in _property_id_tables(path.read_text(), str(path.relative_to(PACKAGE)), ids)]
    assert found == []

    declared: dict[str, list[str]] = {}
    planted = 'NO_ABORT = PropertyEntry("no-abort", "valid scenarios never abort")\n'
    for path in [*sorted(PACKAGE.rglob("*.py")), None]:
        where = str(path.relative_to(PACKAGE)) if path is not None else "planted"
        for k, v in _entries_declared(path.read_text() if path is not None else planted, where, ids).items():
            declared.setdefault(k, []).extend(v)
    assert {k for k, v in declared.items() if len(v) > 1} == {"no-abort"}  # the planted second declaration
    del declared["no-abort"][-1]
    assert set(declared) == ids and all(len(v) == 1 for v in declared.values()), declared
    # its own module: the one that holds its judge (the fuzzer judges those without one)
    for p in REGISTRY:
        if p.judge is not None:
            module = p.judge.__module__.removeprefix("pytest_schedfuzz.").replace(".", "/") + ".py"
            assert declared[p.id][0].startswith(module + ":"), (p.id, declared[p.id], module)


# The rooms, from the bottom (docs/architecture.md): a module imports its own room and those below
# it, never one above. Top-level modules are rooms of their own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("model",),  # plain data
    ("files", "engine", "redis_url", "profiles"),  # what everything shares: files, the targets' errors, the run's configuration
    ("compiled", "builds"),  # the reference's compiled modules; the builds under test and how they are had
    ("reference", "process"),  # the oracle; the processes the engines run in
    ("ggml", "sim"),  # the graph engine; the simulated llama_context
    ("llama",),  # llama.cpp, built on ggml's
    ("strategies", "properties"),
    ("cases",),
    ("options",),
    ("campaign",),
    ("tools", "commands"),
    ("cli", "plugin", "session", "items", "__init__"),  # the front ends
)


def _room(module: str) -> str | None:
    """The room of a module of ours: ``reference``, a package of ``pytest_schedfuzz`` or one of
    its top-level modules; None for anything else."""
    parts = module.split(".")
    if parts[0] == "reference":
        return "reference"
    if parts[0] != "pytest_schedfuzz":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports_up(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """Each import (at module level or inside a function) of a room above the importer's, and of a
    room the layers do not name: "importer -> imported"."""
    layer = {room: k for k, rooms in enumerate(LAYERS) for room in rooms}
    out = []
    for name, (source, package) in sorted(modules.items()):
        here = name.split(".") if package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                targets = [".".join((here[: len(here) - node.level + 1] if node.level else []) + ([node.module] if node.module else []))]
                targets = [f"{targets[0]}.{a.name}" for a in node.names] if node.module is None else targets
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                room, own = _room(target), _room(name)
                if room is None or own is None or room == own:
                    continue
                if room not in layer or own not in layer or layer[room] > layer[own]:
                    out.append(f"{name} -> {target}")
    return out


def test_no_module_imports_a_room_above_its_own() -> None:
    planted = {"pytest_schedfuzz.model.x": ("from ..campaign import fuzz\n", False),
               "pytest_schedfuzz.process.y": ("def f():\n    from ..ggml.lib import import_ggml\n", False),
               "pytest_schedfuzz.llama.z": ("from ..ggml import engine\nfrom ..builds.names import UPSTREAM\n", False),
               "pytest_schedfuzz.newroom.w": ("from ..model import trace\n", False)}
    assert _imports_up(planted) == ["pytest_schedfuzz.model.x -> pytest_schedfuzz.campaign",
                                    "pytest_schedfuzz.newroom.w -> pytest_schedfuzz.model",
                                    "pytest_schedfuzz.process.y -> pytest_schedfuzz.ggml.lib"]
    modules = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path.read_text(), package)
    assert _imports_up(modules) == []


def test_the_architecture_page_names_the_layers_in_order() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    order = page[page.index("## Layers"):].split("\n## ")[0]
    positions = [order.index(f"`{room}") for rooms in LAYERS for room in rooms if room != "__init__"]
    assert positions == sorted(positions), "docs/architecture.md's layers are not in LAYERS' order"


def _files_naming(trees: dict[str, ast.AST], name: str, method: str = "") -> set[str]:
    """The files whose code names ``name``: a string equal to it, a keyword argument of that name,
    or a function ``method``."""
    out = set()
    for where, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value == name) or (isinstance(node, ast.keyword) and node.arg == name) \
                    or (method and isinstance(node, ast.FunctionDef) and node.name == method):
                out.add(where)
                break
    return out


def _figures() -> str:
    """The figures ``docs/architecture.md`` gives, counted from the code: the modules and classes
    over the size rule, the imports up the layers, and, for each kind of entry, the files that
    name its least-named entry (what a new entry of that kind touches)."""
    from pytest_schedfuzz.model.devices import DEVICE_KINDS
    from pytest_schedfuzz.model.llama_calls import CALLS
    from pytest_schedfuzz.model.ops import OPS
    from pytest_schedfuzz.model.versions import VERSIONS
    from pytest_schedfuzz.properties.registry import REGISTRY

    paths = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")])
    sources = {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}
    over = _too_large(sources, exceptions={})
    modules = {}
    for path in paths:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path.read_text(), parts[-1] == "__init__")
    trees = {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text()) for path in paths}
    tables = (("call kind", "`model.llama_calls.CALLS`", [(k, f"_make_{k}") for k in CALLS]),
              ("device kind", "`model.devices.DEVICE_KINDS`", [(k.name, "") for k in DEVICE_KINDS.values() if not k.host]),
              ("graph op", "`model.ops.OPS`", [(k, "") for k in OPS]),
              ("ggml version", "`model.versions.VERSIONS`", [(v.version, "") for v in VERSIONS]),
              ("property", "`properties.registry.REGISTRY`", [(p.id, "") for p in REGISTRY]))
    rows = [f"| modules over {MAX_MODULE_LINES} lines | {sum(': ' in o and 'mixins' not in o for o in over)} |",
            f"| classes over {MAX_CLASS_LINES} lines, with their parts | {sum('mixins' in o for o in over)}, each a named concept "
            f"(`ONE_CONCEPT`): {', '.join('`' + k.split(':')[1] + '`' for k in sorted(ONE_CONCEPT))} |",
            f"| imports up the layers | {len(_imports_up(modules))} |"]
    for kind, table, entries in tables:
        named = {name: _files_naming(trees, name, method) for name, method in entries}
        least = min(named, key=lambda n: (len(named[n]), n))
        rows.append(f"| files a new {kind} touches ({table}; its least-named entry, `{least}`) | {len(named[least])}: "
                    + ", ".join(f"`{f.removeprefix('pytest_schedfuzz/')}`" for f in sorted(named[least])) + " |")
    return "| figure | counted |\n|---|---|\n" + "\n".join(rows) + "\n"


def test_the_architecture_pages_figures_are_counted_from_the_code() -> None:
    """``docs/architecture.md``'s figures are the code's: a file that names a planted entry is
    counted, and the page's table is the one ``_figures`` makes now (run it to update the page)."""
    trees = {"a.py": ast.parse('CALLS = {"frob": 1}\n'), "b.py": ast.parse("def _make_frob(self):\n    pass\n"), "c.py": ast.parse("x = 1\n")}
    assert _files_naming(trees, "frob", "_make_frob") == {"a.py", "b.py"}
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert _figures() in page, "docs/architecture.md's figures are not the code's; they are now:\n" + _figures()


def _name_collisions(paths: list[Path]) -> dict[str, list[str]]:
    """File names that two modules share (``__init__.py`` aside), with the modules."""
    by_name: dict[str, list[str]] = {}
    for p in paths:
        if p.name != "__init__.py":
            by_name.setdefault(p.name, []).append(p.as_posix())
    return {n: sorted(ps) for n, ps in by_name.items() if len(ps) > 1}


def test_no_two_modules_share_a_name() -> None:
    """A module's name says what it holds wherever it is read (a traceback, a docstring's
    reference, an import): no two of the package's and the reference's modules share one; a
    planted pair is caught."""
    assert _name_collisions([Path("a/worker.py"), Path("b/worker.py"), Path("a/__init__.py"), Path("b/__init__.py")]) == {"worker.py": ["a/worker.py", "b/worker.py"]}
    assert _name_collisions([p.relative_to(ROOT) for p in [*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")]]) == {}


FIGURE = re.compile(r"\b\d+(\.\d+)?\s?(ms|µs|×)(?!\w)|\b\d+(\.\d+)? ?s of (CPU|a)\b|\b\d+(\.\d+)?x (the|faster|slower)\b")


def _figures_in_prose(source: str, where: str) -> list[str]:
    """Measured figures (milliseconds, ratios, seconds of CPU) in ``source``'s comments and
    docstrings, which go stale with the next change: figures live in docs/benchmarks.md."""
    import io
    import tokenize

    texts = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node, clean=False):
            texts.append((node.body[0].lineno, ast.get_docstring(node, clean=False) or ""))
    return [f"{where}:{line}: {m.group(0)}" for line, text in texts for m in FIGURE.finditer(text)]


def test_no_measured_figure_in_a_comment_or_docstring() -> None:
    """Comments and docstrings say why in plain sentences; a measured figure there goes stale
    (docs/benchmarks.md holds them, dated by commit). Planted ones are caught, a count is not."""
    planted = '"""Fast: 2.5× the old one."""\nx = 5  # five items, 3 layers\ny = 1  # 5 ms a step\n'
    assert _figures_in_prose(planted, "p") == ["p:3: 5 ms", "p:1: 2.5×"]
    found = [x for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")])
             for x in _figures_in_prose(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []
