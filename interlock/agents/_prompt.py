"""Prompt templates: Jinja2, rendered in its sandbox over the node's ``reads``.

A name the template uses that the state does not have is an error (StrictUndefined),
not an empty string; ``{{ x | default('') }}`` makes a field optional. Mappings and
lists render as JSON (``{{ plan }}``), and ``| json`` does so explicitly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.sandbox import SandboxedEnvironment


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _finalize(value: Any) -> Any:
    return _json(value) if isinstance(value, dict | list) else value


@functools.cache
def environment() -> SandboxedEnvironment:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False,
                               keep_trailing_newline=True, finalize=_finalize)
    env.filters["json"] = _json
    return env


def compile_template(source: str) -> Template:
    """Raises jinja2.TemplateSyntaxError."""
    return environment().from_string(source)


def variables(source: str) -> set[str]:
    """The top-level names a template reads. Raises jinja2.TemplateSyntaxError."""
    from jinja2 import meta

    env = environment()
    return set(meta.find_undeclared_variables(env.parse(source)))


def render(template: Template, scope: Mapping[str, Any]) -> str:
    return template.render(dict(scope))
