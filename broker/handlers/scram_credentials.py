"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554, with
Kafka's answers (its ScramControlManager and ScramImage).

Describe lists each user's mechanisms and iterations, never a secret; no users named
means every user; an unknown user is RESOURCE_NOT_FOUND, one named twice
DUPLICATE_RESOURCE. Alter takes salted passwords (the client runs Hi(password, salt,
iterations)) and stores the keys derived from them: an empty user is
UNACCEPTABLE_CREDENTIAL, an unknown mechanism UNSUPPORTED_SASL_MECHANISM, iterations
outside 4096..16384 UNACCEPTABLE_CREDENTIAL, a user altered twice in one request
DUPLICATE_RESOURCE, deleting a credential that does not exist RESOURCE_NOT_FOUND. A
user's changes are written together, once every one of them is valid. Describe needs
DESCRIBE on the cluster, Alter ALTER (CLUSTER_AUTHORIZATION_FAILED), as in Kafka.
"""

from __future__ import annotations

from typing import Any

from tierbroker.broker.handlers.authorize import Op, unauthorized_cluster
from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.broker.metadata.scram_credentials import ScramCredentialStore
from tierbroker.broker.metadata.store import StoreError
from tierbroker.broker.metadata.topic_admin import store_error
from tierbroker.broker.security.sasl.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    ScramCredential,
    ScramMechanism,
)
from tierbroker.protocol.codec import RecordsSplicer, Request
from tierbroker.protocol.errors import ErrorCode

Error = tuple[ErrorCode, str]
DUPLICATE = (
    ErrorCode.duplicate_resource,
    "A user credential cannot be altered twice in the same request",
)


def _store(ctx: BrokerContext) -> ScramCredentialStore:
    assert ctx.scram_credentials is not None, "the broker made its credential store"
    return ctx.scram_credentials


async def handle_describe_user_scram_credentials(
    ctx: BrokerContext, request: Request, _splicer: RecordsSplicer
) -> Any:
    m = response_module(request.api_key, request.api_version)
    if (denied := unauthorized_cluster(ctx, Op.DESCRIBE)) is not None:
        return make(
            m.DescribeUserScramCredentialsResponse,
            throttle_time=NO_THROTTLE,
            error_code=denied,
            error_message="Cluster authorization failed.",  # librdkafka frees a null one
            results=(),
        )
    store = _store(ctx)
    named = [u.name for u in request.body.users or ()]
    users = named or sorted(store.users)
    results = []
    for user in dict.fromkeys(users):
        credentials = store.users.get(user, {})
        if named.count(user) > 1:
            error: Error | None = (
                ErrorCode.duplicate_resource,
                "Cannot describe SCRAM credentials for the same user twice in a single "
                f"request: {user}",
            )
        elif not credentials:
            error = (
                ErrorCode.resource_not_found,
                f"Attempt to describe a user credential that does not exist: {user}",
            )
        else:
            error = None
        infos = tuple(
            m.CredentialInfo(mechanism=mechanism.type_id, iterations=credential.iterations)
            for mechanism, credential in sorted(credentials.items(), key=lambda i: i[0].type_id)
        )
        results.append(
            m.DescribeUserScramCredentialsResult(
                user=user,
                error_code=error[0] if error else ErrorCode.none,
                error_message=error[1] if error else None,
                credential_infos=() if error else infos,
            )
        )
    return make(
        m.DescribeUserScramCredentialsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )


async def handle_alter_user_scram_credentials(
    ctx: BrokerContext, request: Request, _splicer: RecordsSplicer
) -> Any:
    m = response_module(request.api_key, request.api_version)
    if (denied := unauthorized_cluster(ctx, Op.ALTER)) is not None:  # every user refused
        users = [a.name for a in (*request.body.deletions, *request.body.upsertions)]
        refused = tuple(
            m.AlterUserScramCredentialsResult(
                user=u, error_code=denied, error_message="Cluster authorization failed."
            )
            for u in dict.fromkeys(users)
        )
        return make(m.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE, results=refused)
    store = _store(ctx)
    errors: dict[str, Error] = {}
    changes: dict[str, dict[ScramMechanism, ScramCredential | None]] = {}
    for deletion in request.body.deletions:
        _note(deletion.name, _check_deletion(store, deletion), None, deletion, errors, changes)
    for upsertion in request.body.upsertions:
        error = _check_upsertion(upsertion)
        _note(upsertion.name, error, _credential(upsertion), upsertion, errors, changes)
    for user, user_changes in changes.items():
        try:
            await store.alter(user, user_changes)
        except StoreError as e:
            failure = store_error(f"altering the SCRAM credentials of {user!r}", e)
            errors[user] = (failure.code, str(failure))
    results = [
        m.AlterUserScramCredentialsResult(
            user=user,
            error_code=errors[user][0] if user in errors else ErrorCode.none,
            error_message=errors[user][1] if user in errors else None,
        )
        for user in dict.fromkeys([*changes, *errors])
    ]
    return make(
        m.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE, results=tuple(results)
    )


def _note(
    user: str,
    error: Error | None,
    credential: ScramCredential | None,
    alteration: Any,
    errors: dict[str, Error],
    changes: dict[str, dict[ScramMechanism, ScramCredential | None]],
) -> None:
    """Kafka's rule: one alteration per user and request; a user with an error is left."""
    if user in errors:
        return
    if user in changes:
        del changes[user]
        errors[user] = DUPLICATE
    elif error is not None:
        errors[user] = error
    else:
        mechanism = ScramMechanism.by_type(alteration.mechanism)
        assert mechanism is not None
        changes[user] = {mechanism: credential}


def _check_user_and_mechanism(name: str, mechanism_type: int) -> Error | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if ScramMechanism.by_type(mechanism_type) is None:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def _check_deletion(store: ScramCredentialStore, deletion: Any) -> Error | None:
    error = _check_user_and_mechanism(deletion.name, deletion.mechanism)
    if error is not None:
        return error
    mechanism = ScramMechanism.by_type(deletion.mechanism)
    assert mechanism is not None
    if store.lookup(mechanism, deletion.name) is None:
        return (
            ErrorCode.resource_not_found,
            "Attempt to delete a user credential that does not exist",
        )
    return None


def _check_upsertion(upsertion: Any) -> Error | None:
    error = _check_user_and_mechanism(upsertion.name, upsertion.mechanism)
    if error is not None:
        return error
    if upsertion.iterations < MIN_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if upsertion.iterations > MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    return None


def _credential(upsertion: Any) -> ScramCredential | None:
    mechanism = ScramMechanism.by_type(upsertion.mechanism)
    if mechanism is None:
        return None
    return mechanism.credential(
        bytes(upsertion.salted_password), bytes(upsertion.salt), upsertion.iterations
    )
