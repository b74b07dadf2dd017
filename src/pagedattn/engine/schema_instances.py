"""Which parts of a JSON schema have a finite instance, and the schema without the parts that
have none.

A grammar decoder writes an instance left to right; a schema part with no finite instance (an
object whose required property is the object itself, an array of at least one of itself) lets
it start a value it can never finish. :func:`finite_instances` finds those parts by a least
fixpoint over the schema's local ``$ref`` targets (a part is finite when some branch of it is:
``anyOf`` / ``oneOf`` some branch, ``allOf`` every branch, an object every required property, an
array of ``minItems >= 1`` its items, a scalar type, ``enum`` or ``const`` always; a part without
``type`` may be any JSON type, so it is finite through its scalar types).

:func:`prune_infinite` then rewrites the schema so that a decoder can only start what it can
finish, leaving its set of finite instances unchanged: branches and types with no finite
instance are dropped, an optional property whose schema has none becomes ``false``, an array
whose items have none holds ``maxItems: 0``. When the root itself has no finite instance the
request is refused (:class:`NoFiniteInstanceError`), naming the first required path that
loops. References outside the document, and keywords this module does not know, are taken to
have finite instances (never refused on a guess).
"""

from __future__ import annotations

import copy
from typing import Any

OBJECT_KEYS = ("properties", "required", "additionalProperties", "minProperties")
ARRAY_KEYS = ("items", "prefixItems", "minItems")
ALL_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


class NoFiniteInstanceError(ValueError):
    """The schema has no finite instance (its message names a path that never ends)."""


def _pointer(doc: Any, ref: str) -> Any:
    """The node a local ``$ref`` names, or None (external or unresolvable)."""
    if not ref.startswith("#"):
        return None
    node = doc
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class _Analysis:
    def __init__(self, doc: Any) -> None:
        self.doc = doc
        self.finite: set[str] = set()  # the $ref targets known to have a finite instance

    def run(self) -> None:
        refs = sorted(set(_refs(self.doc)) | {"#"})
        changed = True
        while changed:
            changed = False
            for ref in refs:
                target = _pointer(self.doc, ref)
                if ref not in self.finite and (target is None or self.node(target)):
                    self.finite.add(ref)
                    changed = True

    def ref(self, ref: str) -> bool:
        return _pointer(self.doc, ref) is None or ref in self.finite

    def node(self, node: Any) -> bool:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and not self.ref(ref):
            return False
        if isinstance(node.get("allOf"), list) and not all(map(self.node, node["allOf"])):
            return False
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and not any(map(self.node, node[key])):
                return False
        if "enum" in node or "const" in node:
            return True
        return any(self.type_finite(node, t) for t in _types(node))

    def type_finite(self, node: dict[str, Any], kind: str) -> bool:
        if kind == "object":
            return all(self.node(s) for _, s in _required(node))
        if kind == "array":
            return all(self.node(s) for _, s in _required_items(node))
        return True


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for x in node for r in _refs(x)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [r for k, v in node.items() if k not in ("enum", "const") for r in _refs(v)]


def _types(node: dict[str, Any]) -> list[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    return list(ALL_TYPES)


def _required(node: dict[str, Any]) -> list[tuple[str, Any]]:
    props: dict[str, Any] = node.get("properties") or {}
    props = props if isinstance(props, dict) else {}
    extra = node.get("additionalProperties", True)
    names: list[Any] = node.get("required") or []
    names = names if isinstance(names, list) else []
    return [(n, props.get(n, extra)) for n in names if isinstance(n, str)]


def _required_items(node: dict[str, Any]) -> list[tuple[int, Any]]:
    least = node.get("minItems", 0)
    least = least if isinstance(least, int) else 0
    prefix: list[Any] = node.get("prefixItems") or []
    prefix = prefix if isinstance(prefix, list) else []
    items = node.get("items", True)
    return [(i, prefix[i] if i < len(prefix) else items) for i in range(min(least, 64))]


def finite_instances(schema: Any) -> bool:
    """Whether ``schema`` (a parsed JSON schema) has an instance of finite size."""
    analysis = _Analysis(schema)
    analysis.run()
    return analysis.node(schema)


def prune_infinite(schema: Any) -> Any:
    """``schema`` rewritten so that every part a decoder may start can be finished (see the
    module doc); the input is not modified.

    Raises:
        NoFiniteInstanceError: the schema has no finite instance.
    """
    if not isinstance(schema, dict):
        return schema
    analysis = _Analysis(schema)
    analysis.run()
    if not analysis.node(schema):
        path = _loop(analysis, schema, "")
        why = (
            "it only refers to itself"
            if path == "/"
            else f"{path} is required and never ends; make that part optional or give it a "
            "non-recursive branch"
        )
        raise NoFiniteInstanceError(
            f"the schema admits no output: it has no finite instance ({why})"
        )
    out = copy.deepcopy(schema)
    _prune(analysis, out, 0)
    return out


def _loop(analysis: _Analysis, node: Any, path: str, seen: frozenset[int] = frozenset()) -> str:
    """A path (``/child``) of required parts with no finite instance, up to where it repeats,
    for the message."""
    if id(node) in seen or len(seen) > 32 or not isinstance(node, dict):
        return path or "/"
    seen = seen | {id(node)}
    ref = node.get("$ref")
    if isinstance(ref, str) and (target := _pointer(analysis.doc, ref)) is not None:
        return _loop(analysis, target, path, seen)
    for kind in _types(node):
        subs: list[tuple[Any, Any]] = []
        if kind == "object":
            subs += _required(node)
        if kind == "array":
            subs += _required_items(node)[:1]
        for name, sub in subs:
            if not analysis.node(sub):
                return _loop(analysis, sub, f"{path}/{name}", seen)
    return path or "/"


def _prune(analysis: _Analysis, node: Any, depth: int) -> None:
    if depth > 256 or not isinstance(node, dict):
        return
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and any(map(analysis.node, branches)):
            node[key] = [b for b in branches if analysis.node(b)]
    has_type = "type" in node
    looks = {
        "object": any(k in node for k in OBJECT_KEYS),
        "array": any(k in node for k in ARRAY_KEYS),
    }
    if has_type or any(looks.values()):
        kinds = _types(node)
        finite = [k for k in kinds if analysis.type_finite(node, k)]
        if finite and finite != kinds:
            node["type"] = finite if len(finite) > 1 else finite[0]
    props = node.get("properties")
    if isinstance(props, dict):
        required = {n for n, _ in _required(node)}
        for name, sub in props.items():
            if name not in required and not analysis.node(sub):
                props[name] = False
    if "items" in node and not analysis.node(node["items"]):
        prefix = node.get("prefixItems")
        node["maxItems"] = len(prefix) if isinstance(prefix, list) else 0
    for key, value in node.items():
        if key in ("enum", "const"):
            continue
        if isinstance(value, dict):
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                for sub in value.values():
                    _prune(analysis, sub, depth + 1)
            else:
                _prune(analysis, value, depth + 1)
        elif isinstance(value, list):
            for sub in value:
                _prune(analysis, sub, depth + 1)
