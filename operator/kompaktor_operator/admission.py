"""What a CompactorGroup may use (issue 16 §2): the operator, not the group's author, decides.

Anyone allowed to create a CompactorGroup must not be able to run an arbitrary image, or a pod
with another ServiceAccount or Secret of the namespace, through the operator's rights. A group
may name only:

- an image from the allow-list (``KOMPAKTOR_ALLOWED_IMAGES``; chart value
  ``compactor.allowedImages``) — the operator's default compactor image is always allowed; an
  entry ending in ``*`` allows every image that starts with what comes before it;
- the chart's compactor ServiceAccount (the default) or one from ``KOMPAKTOR_ALLOWED_SERVICE_ACCOUNTS``
  (``compactor.allowedServiceAccounts``);
- Secrets (``spec.redis.secretName``, ``spec.storage.credentialsSecret``) that are the operator's
  own defaults or in ``KOMPAKTOR_ALLOWED_SECRETS`` (``compactor.allowedSecrets``).

Anything else is a :class:`Refusal` naming the rule; the handler reports it as a condition and
creates nothing. Pure: no I/O. Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from dataclasses import dataclass

from kompaktor_operator.config import OperatorConfig
from kompaktor_operator.models import CompactorGroupSpec

IMAGE_NOT_ALLOWED = "ImageNotAllowed"
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
SECRET_NOT_ALLOWED = "SecretNotAllowed"


@dataclass(frozen=True)
class Refusal:
    rule: str  # the condition's reason
    message: str


def image_allowed(image: str, config: OperatorConfig) -> bool:
    if image == config.compactor_image:
        return True
    for entry in config.allowed_images:
        if entry.endswith("*") and image.startswith(entry[:-1]):
            return True
        if image == entry:
            return True
    return False


def allowed_secrets(config: OperatorConfig) -> set[str]:
    own = {config.redis_secret, config.storage_secret, config.drain_token_secret}
    return {s for s in own if s} | set(config.allowed_secrets)


def check_group(spec: CompactorGroupSpec, config: OperatorConfig) -> Refusal | None:
    """The first rule ``spec`` breaks, or None when the operator may build its pods."""
    image = spec.image or config.compactor_image
    if not image_allowed(image, config):
        return Refusal(IMAGE_NOT_ALLOWED,
                       f"image {image!r} is not allowed: the operator runs only {config.compactor_image!r}"
                       f"{_and(config.allowed_images)} (chart value compactor.allowedImages)")
    account = spec.service_account_name
    if account and account != config.compactor_service_account and account not in config.allowed_service_accounts:
        return Refusal(SERVICE_ACCOUNT_NOT_ALLOWED,
                       f"serviceAccountName {account!r} is not allowed: compactors run as "
                       f"{config.compactor_service_account!r}{_and(config.allowed_service_accounts)} "
                       f"(chart value compactor.allowedServiceAccounts)")
    allowed = allowed_secrets(config)
    named = [("spec.redis.secretName", spec.redis.secret_name if spec.redis else None),
             ("spec.storage.credentialsSecret", spec.storage.credentials_secret if spec.storage else None)]
    for field, secret in named:
        if secret and secret not in allowed:
            return Refusal(SECRET_NOT_ALLOWED,
                           f"{field} {secret!r} is not allowed: a group may use only the Secrets "
                           f"{', '.join(repr(s) for s in sorted(allowed)) or '(none)'} "
                           f"(chart value compactor.allowedSecrets)")
    return None


def _and(extra: tuple[str, ...]) -> str:
    return f" and {', '.join(repr(e) for e in extra)}" if extra else ""
