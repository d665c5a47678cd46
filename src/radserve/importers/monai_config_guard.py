"""What a MONAI bundle config may make MONAI's ``ConfigParser`` run while radserve imports it.

MONAI evaluates ``$`` expressions with ``eval`` and instantiates any importable callable a
``_target_`` names, so an unchecked config runs whatever its author wrote
(``"$open('/x', 'w')"``, ``{"_target_": "os.system", "command": ...}``).
:class:`CheckedConfigParser` checks each expression and component when MONAI is about to
evaluate it (only the items the import resolves: its four keys and what they reference)
and refuses anything outside a small grammar:

* expressions: constants, references, arithmetic, comparisons, conditionals, containers,
  comprehensions, lambdas (``Lambdad``; their bodies in the same grammar), public
  attributes of ``monai``/``torch``/``numpy`` and of references, and calls of
  :data:`CALLS` only; ``$import`` of :data:`IMPORTS` only (a module that is imported
  runs its top level: ``scripts`` is the bundle's own, as below); what an expression
  may build is bounded by :mod:`monai_config_bounds` (``10**10**10``, ``[0]*999999999``);
* ``_target_``: a class (never a function: instantiating one calls it) in :data:`TARGETS`'
  packages, named by a string, and not from a module whose classes act when built
  (``monai.apps``' runners and downloading datasets: before session 35 ``AutoRunner``
  made its work folder and wrote there during an import). ``scripts.`` is the bundle's
  own package: its classes are code the bundle ships (bring-your-own-model.md: import
  bundles you trust).
"""

from __future__ import annotations

import ast
import inspect
import pydoc
from typing import Any

from radserve.importers import ImportRefusedError
from radserve.importers import monai_config_bounds as bounds

__all__ = [
    "CALLS",
    "IMPORTS",
    "TARGETS",
    "CheckedConfigParser",
    "check_component_options",
    "check_expression",
]

ROOTS = frozenset({"monai", "torch", "numpy", "np", "__local_refs"})  # MONAI's globals
IMPORTS = frozenset({"os", "glob", "json", "numpy", "pandas", "torch", "monai", "scripts"})
CALLS = frozenset(
    {
        "abs", "dict", "float", "int", "len", "list", "max", "min", "range", "round",
        "sorted", "str", "tuple",
        "glob.glob", "os.path.join", "torch.device", "torch.cuda.is_available", "torch.from_numpy",
        "torch.tensor", "torch.where", "torch.cat", "torch.stack", "torch.argmax",
        "torch.sigmoid", "torch.softmax",
        "torch.load",  # weights_only=True: torch's default since 2.6 (an explicit False is refused)
    }
)  # fmt: skip
TARGETS = (
    "monai.transforms.", "monai.inferers.", "monai.networks.", "monai.apps.",
    "torch.nn.", "scripts.",
)  # fmt: skip
_TARGET_NAMES = frozenset({"torch.device"})
# modules of TARGETS whose classes act when built: runners that make work folders and
# write files (AutoRunner, nnUNetV2Runner), datasets and archives that download
# (MedNISTDataset, DecathlonDataset, TciaDataset, MMAR loaders); checked on the class's
# own module, so a re-export (``monai.apps.AutoRunner``) is refused as well
_ACTING_MODULES = (
    "monai.apps.auto3dseg", "monai.apps.nnunet", "monai.apps.datasets", "monai.apps.mmars",
    "monai.apps.utils", "monai.apps.deepgrow.dataset", "monai.apps.pathology.data",
)  # fmt: skip
_NODES = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Attribute, ast.Subscript, ast.Slice,
    ast.List, ast.Tuple, ast.Dict, ast.Set, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
    ast.IfExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension,
    ast.Store, ast.keyword, ast.Call, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
    ast.Lambda, ast.arguments, ast.arg,  # a function of the data (Lambdad): its body is checked
)  # fmt: skip


def _refuse(item_id: str, reason: str) -> None:
    raise ImportRefusedError(
        f"the MONAI config's {item_id!r} {reason}: radserve does not let MONAI evaluate it"
    )


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def _check_import(source: str, item_id: str) -> None:
    tree = ast.parse(source, mode="exec")
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            _refuse(item_id, "is an import expression with other statements")
        for name in names:
            if name.split(".")[0] not in IMPORTS:
                _refuse(item_id, f"imports {name!r} (allowed: {', '.join(sorted(IMPORTS))})")


def check_expression(expression: str, item_id: str) -> ast.Expression | None:
    """Refuse ``expression`` (a config value without its ``$``) unless it is in the grammar;
    its syntax tree (None for an import)."""
    source = expression.strip()
    if source.startswith(("import ", "from ")):
        _check_import(source, item_id)
        return None
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        _refuse(item_id, f"is not a Python expression ({exc.msg})")
    bound = {
        n.id for c in ast.walk(tree) if isinstance(c, ast.comprehension)
        for n in ast.walk(c.target) if isinstance(n, ast.Name)
    } | {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}  # fmt: skip
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            _refuse(item_id, f"holds a {type(node).__name__} ({source[:80]!r})")
        if isinstance(node, ast.Name) and node.id not in ROOTS | IMPORTS | CALLS | bound:
            _refuse(item_id, f"names {node.id!r}")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            _refuse(item_id, f"reads the private attribute {node.attr!r}")
        if isinstance(node, ast.Call):
            if _dotted(node.func) not in CALLS:
                _refuse(item_id, f"calls {ast.unparse(node.func)[:80]!r}")
            for keyword in node.keywords:
                if keyword.arg is None or (
                    keyword.arg == "weights_only"
                    and not (isinstance(keyword.value, ast.Constant) and keyword.value.value)
                ):
                    _refuse(item_id, f"passes {ast.unparse(keyword)[:80]!r}")
    return tree


def check_target(target: Any, item_id: str) -> None:
    """Refuse a ``_target_`` that is not a string naming a class in :data:`TARGETS`."""
    if not isinstance(target, str):
        _refuse(item_id, f"has a _target_ that is not a name ({type(target).__name__})")
    if target in _TARGET_NAMES:
        return
    if not target.startswith(TARGETS):
        _refuse(item_id, f"instantiates {target!r} (allowed: {', '.join(TARGETS)})")
    try:
        found = pydoc.locate(target)
    except Exception as exc:
        _refuse(item_id, f"instantiates {target!r}, which cannot be imported ({exc})")
    if not inspect.isclass(found):
        _refuse(item_id, f"instantiates {target!r}, a function, not a class (it would be called)")
    module = getattr(found, "__module__", "") or ""
    if any(module == m or module.startswith(m + ".") for m in _ACTING_MODULES):
        _refuse(
            item_id,
            f"instantiates {target!r} ({module}): a runner or a dataset that writes files or "
            "downloads when it is built, nothing an inference config needs",
        )


def check_component_options(config: Any, item_id: str) -> None:
    """Refuse a component's ``_debug_`` and a ``_mode_`` other than ``default``.

    MONAI's ``instantiate`` enters Python's debugger (``breakpoint()`` for ``_debug_``,
    ``pdb.runcall`` for ``_mode_: debug``): the import stops at a ``(Pdb)`` prompt
    waiting for the keyboard, and pdb first runs the commands of a ``.pdbrc`` in the
    current folder, Python statements included (a bundle imported from its own folder
    ran the ``.pdbrc`` it shipped). ``_mode_: callable`` hands back the class or a
    ``functools.partial`` in place of the object, which no mapping here can read."""
    if not isinstance(config, dict):
        return
    if config.get("_debug_", False) not in (None, False):  # MONAI pops it as a truth value
        _refuse(item_id, "asks for _debug_ (MONAI would stop in Python's debugger)")
    mode = config.get("_mode_", "default")
    if mode != "default":
        _refuse(
            item_id,
            f"has _mode_ {str(mode)[:40]!r}; only 'default' builds the object ('debug' stops "
            "in Python's debugger, 'callable' gives a function in its place)",
        )


def _checked_items() -> tuple[type, type]:
    from monai.bundle.config_item import ConfigComponent, ConfigExpression

    class CheckedExpression(ConfigExpression):
        def evaluate(self, globals=None, locals=None):
            value = self.get_config()
            if not (isinstance(value, str) and self.is_expression(value)):
                return super().evaluate(globals, locals)
            tree = check_expression(value[len(self.prefix) :], self.get_id())
            if tree is None or not self.run_eval:
                return super().evaluate(globals, locals)
            try:  # MONAI's own eval, with its sizes bounded (monai_config_bounds)
                return bounds.evaluate(tree, {**self.globals, **(globals or {})}, locals)
            except bounds.BudgetExceededError as exc:
                _refuse(self.get_id(), str(exc))
            except Exception as exc:
                raise RuntimeError(f"Failed to evaluate {self}") from exc

    class CheckedComponent(ConfigComponent):
        def resolve_module_name(self):
            name = super().resolve_module_name()
            check_target(name, self.get_id())
            return name

        def instantiate(self, **kwargs: Any) -> object:
            check_component_options(self.get_config(), self.get_id())
            return super().instantiate(**kwargs)

    return CheckedExpression, CheckedComponent


def CheckedConfigParser(*args: Any, **kwargs: Any) -> Any:
    """A ``monai.bundle.ConfigParser`` whose expressions and components are checked
    (:func:`check_expression`, :func:`check_target`) just before MONAI evaluates them."""
    from monai.bundle import ConfigParser
    from monai.bundle.config_item import ConfigComponent, ConfigExpression

    expression_cls, component_cls = _checked_items()

    class Checked(ConfigParser):
        def parse(self, reset: bool = True) -> None:
            super().parse(reset)
            items = self.ref_resolver.items
            for item_id, item in list(items.items()):
                if type(item) is ConfigExpression:
                    items[item_id] = expression_cls(item.get_config(), item_id, self.globals)
                elif type(item) is ConfigComponent:
                    items[item_id] = component_cls(item.get_config(), item_id, self.locator)

    return Checked(*args, **kwargs)
