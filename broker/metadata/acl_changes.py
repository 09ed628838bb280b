"""Creating and deleting ACLs, as Kafka's AclAuthorizer does for CreateAcls and DeleteAcls.

Creations are grouped by pattern, one conditional write each. A deletion applies to every
pattern this broker knows and to the patterns a filter names exactly (read from the store,
so an ACL just created through another broker is deleted too); each matching ACL is
reported once, under the first filter that matched it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tierbroker.broker.metadata.acl_store import AclConflictError, AclStore
from tierbroker.broker.metadata.store import StoreError
from tierbroker.broker.security.authorizer.acl import AclBinding, AclBindingFilter, ResourcePattern
from tierbroker.broker.security.authorizer.acl_cache import Entries


@dataclass(frozen=True, slots=True)
class Failure:
    """An ACL change that failed: `invalid` for a request's fault, else the store's."""

    message: str
    invalid: bool = False


async def create_acls(store: AclStore, bindings: Sequence[AclBinding]) -> list[Failure | None]:
    """Each binding's failure, None for one created (or already there)."""
    results: list[Failure | None] = [None] * len(bindings)
    by_pattern: dict[ResourcePattern, list[int]] = {}
    for i, binding in enumerate(bindings):
        reason = binding.invalid_reason()
        if reason is not None:
            results[i] = Failure(reason, invalid=True)
        else:
            by_pattern.setdefault(binding.pattern, []).append(i)
    for pattern, indexes in by_pattern.items():
        added = frozenset(bindings[i].entry for i in indexes)
        try:
            await store.update(pattern, added.union)
        except (StoreError, AclConflictError) as e:
            for i in indexes:
                results[i] = Failure(f"ACLs of {pattern} not stored: {e}")
    return results


@dataclass(frozen=True, slots=True)
class Deleted:
    binding: AclBinding
    failure: Failure | None = None


async def delete_acls(store: AclStore, filters: Sequence[AclBindingFilter]) -> list[list[Deleted]]:
    """The ACLs each filter deleted (or failed to)."""
    results: list[list[Deleted]] = [[] for _ in filters]
    patterns = dict.fromkeys(store.cache.patterns())
    for selected in filters:
        patterns.update(dict.fromkeys(selected.exact_patterns()))
    for pattern in patterns:
        matching = [i for i, f in enumerate(filters) if f.matches_pattern(pattern)]
        if not matching:
            continue
        owner: dict[AclBinding, int] = {}  # each ACL deleted, and the filter it counts for
        failure = None
        try:
            await store.update(pattern, _remover(filters, matching, pattern, owner))
        except (StoreError, AclConflictError) as e:
            failure = Failure(f"ACLs of {pattern} not deleted: {e}")
        for binding, i in owner.items():
            results[i].append(Deleted(binding, failure))
    return results


def _remover(
    filters: Sequence[AclBindingFilter],
    matching: list[int],
    pattern: ResourcePattern,
    owner: dict[AclBinding, int],
) -> Callable[[Entries], Entries]:
    """The change that drops the entries the `matching` filters select, noting in `owner`
    the first filter of each (anew on each attempt of the conditional write)."""

    def keep(current: Entries) -> Entries:
        owner.clear()
        kept = set()
        for entry in current:
            first = next((i for i in matching if filters[i].matches_entry(entry)), None)
            if first is None:
                kept.add(entry)
            else:
                owner[AclBinding(pattern, entry)] = first
        return frozenset(kept)

    return keep
