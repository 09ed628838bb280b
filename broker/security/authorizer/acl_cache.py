"""`AclCache`: every ACL this broker knows, indexed for the authorizer's per-request checks.

One entry set per resource pattern, as the store keeps them (one znode each). A check
looks up the resource's literal name, the literal `*` of its type, and each prefixed
pattern that is a prefix of the name: prefixed names are found by dict lookups of the
name's prefixes, only at the lengths some prefixed pattern of that type has, so a check
costs a handful of lookups however many ACLs there are. Not shared across event loops.
"""

from __future__ import annotations

from collections.abc import Iterator

from tierbroker.broker.security.authorizer.acl import (
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    PatternType,
    ResourcePattern,
    ResourceType,
)

Entries = frozenset[AccessControlEntry]


class AclCache:
    def __init__(self) -> None:
        self._by_pattern: dict[ResourcePattern, Entries] = {}
        self._literal: dict[tuple[ResourceType, str], Entries] = {}
        self._prefixed: dict[ResourceType, dict[str, Entries]] = {}
        # Invariant: the distinct name lengths of `_prefixed[type]`, ascending.
        self._prefix_lengths: dict[ResourceType, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_pattern.values())

    def get(self, pattern: ResourcePattern) -> Entries:
        return self._by_pattern.get(pattern, frozenset())

    def patterns(self) -> list[ResourcePattern]:
        return list(self._by_pattern)

    def replace(self, pattern: ResourcePattern, entries: Entries) -> None:
        """The ACLs of `pattern` are now `entries` (none: the pattern is gone)."""
        if entries:
            self._by_pattern[pattern] = entries
        elif self._by_pattern.pop(pattern, None) is None:
            return
        if pattern.pattern_type == PatternType.LITERAL:
            key = (pattern.resource_type, pattern.name)
            if entries:
                self._literal[key] = entries
            else:
                self._literal.pop(key, None)
            return
        names = self._prefixed.setdefault(pattern.resource_type, {})
        if entries:
            names[pattern.name] = entries
        else:
            names.pop(pattern.name, None)
        self._prefix_lengths[pattern.resource_type] = tuple(sorted({len(n) for n in names}))

    def clear(self) -> None:
        for pattern in list(self._by_pattern):
            self.replace(pattern, frozenset())

    def matching(self, resource_type: ResourceType, name: str) -> Iterator[AccessControlEntry]:
        """Every ACL whose pattern applies to the resource `name` of `resource_type`."""
        literal = self._literal
        found = literal.get((resource_type, name))
        if found:
            yield from found
        if name != WILDCARD and (found := literal.get((resource_type, WILDCARD))):
            yield from found
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            prefixed = self._prefixed[resource_type]
            for length in lengths:
                if length > len(name):
                    break
                if found := prefixed.get(name[:length]):
                    yield from found

    def patterns_of_type(
        self, resource_type: ResourceType
    ) -> Iterator[tuple[ResourcePattern, Entries]]:
        for pattern, entries in self._by_pattern.items():
            if pattern.resource_type == resource_type:
                yield pattern, entries

    def bindings(self, selected: AclBindingFilter) -> list[AclBinding]:
        """The ACLs `selected` matches, ordered by pattern."""
        found: list[AclBinding] = []
        for pattern, entries in self._by_pattern.items():
            if selected.matches_pattern(pattern):
                found.extend(AclBinding(pattern, e) for e in entries if selected.matches_entry(e))
        return sorted(found, key=_order)


def _order(binding: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    p, e = binding.pattern, binding.entry
    return (
        p.resource_type,
        p.name,
        p.pattern_type,
        e.principal,
        e.host,
        e.operation,
        e.permission_type,
    )
