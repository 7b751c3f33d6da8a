"""The version labels a vLLM server on Kubernetes is run from, and what each may say.

``vllm.args`` passes flags to the server: only those the platform allows
(``SWITCHYARD_VLLM_ALLOWED_ARGS``). ``vllm.hf_token_secret`` names a Secret of the server's
own namespace: a Secret name, never ``namespace/name``. Checked when a version is registered
(``ModelVersion.clean``) and again when a server is run or rolled (``rollouts.workloads.specs``),
since the allowed flags are a setting that may change in between.
"""

from __future__ import annotations

import re
import shlex

from django.conf import settings

MODEL = "vllm.model"  # --model: a Hugging Face id, or a path in the image or volume
ARGS = "vllm.args"  # more vLLM arguments, shell-quoted
TOKEN_SECRET = "vllm.hf_token_secret"  # a Secret whose key "token" becomes HF_TOKEN

# A Secret name (a DNS-1123 subdomain): no "/", so never another namespace's.
_SECRET_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# A flag's value that starts with a dash: a negative number (``--swap-space -1``).
_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")


def allowed_flags() -> set[str]:
    """The flags the platform allows, as ``--flag-name``."""
    return {flag.replace("_", "-") for flag in settings.SWITCHYARD_VLLM_ALLOWED_ARGS}


def args_problem(text: str) -> str | None:
    """What is wrong with ``text`` as the ``vllm.args`` label, or None: it splits into flags
    the platform allows, as ``--flag``, ``--flag value`` or ``--flag=value`` (``--flag_name``
    is read as vLLM reads it, ``--flag-name``; abbreviations are not flags)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        return f"cannot be split into arguments: {exc}"
    allowed = allowed_flags()
    takes_value = False
    for word in words:
        if word.startswith("-") and not _NUMBER.match(word):
            flag, has_value, _value = word.partition("=")
            if flag.replace("_", "-") not in allowed:
                return (f"{flag} is not a vLLM flag the platform allows; allowed: "
                        f"{', '.join(sorted(allowed)) or 'none'}")
            takes_value = not has_value
        elif takes_value:
            takes_value = False
        else:
            return f"{word!r} is no flag's value: give --flag value or --flag=value"
    return None


def secret_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the ``vllm.hf_token_secret`` label, or None: the name
    of a Secret in the server's own namespace (a DNS-1123 subdomain, no ``namespace/``)."""
    if _SECRET_NAME.match(name):
        return None
    if "/" in name:
        return (f"{name!r} names another namespace: a server reads Secrets of its own "
                "namespace only; give the Secret's name")
    return f"{name!r} is not a Secret name (lowercase letters, digits, '-' and '.')"


def problems(labels: dict[str, str]) -> list[str]:
    """What is wrong with the vLLM labels among a version's ``labels`` (strings), as
    ``labels.<name>: ...``."""
    found = []
    if ARGS in labels and (problem := args_problem(labels[ARGS])):
        found.append(f"labels.{ARGS}: {problem}")
    if labels.get(TOKEN_SECRET) and (problem := secret_problem(labels[TOKEN_SECRET])):
        found.append(f"labels.{TOKEN_SECRET}: {problem}")
    return found
