"""A transform's prompt template: its placeholders checked when it is set
(`checked_template`), and rendered with ``{{name}}`` as a literal ``{name}``
(`render_template`)."""

from __future__ import annotations

import re
from typing import Any

from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.utils import get_template_vars

#: ``{{name}}``: a literal ``{name}`` in a prompt, not a placeholder. LlamaIndex prompts
#: keep braces around anything but a name (JSON, sets) as written, so only a braced name
#: needs this escape.
_ESCAPED = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_.]*)\}\}")


def checked_template(
    prompt: str | BasePromptTemplate, allowed: frozenset[str]
) -> BasePromptTemplate:
    """``prompt`` as a template, once it is known to hold ``{query}`` and no placeholder
    outside ``allowed``; else a `ValueError` naming what is wrong (and how to write a
    literal ``{name}``)."""
    template = PromptTemplate(prompt) if isinstance(prompt, str) else prompt
    if isinstance(template, PromptTemplate):
        names = set(get_template_vars(_ESCAPED.sub("", template.get_template())))
    else:
        names = set(template.template_vars)
    if "query" not in names:
        raise ValueError("prompt must contain the {query} placeholder")
    extra = names - allowed
    if extra:
        raise ValueError(
            f"prompt has unknown placeholder(s) {sorted(extra)}; allowed: {sorted(allowed)} "
            "(to write a literal {name}, double its braces: {{name}}; other braces, as in "
            "JSON, are kept as written)"
        )
    return template


def render_template(template: BasePromptTemplate, **kwargs: Any) -> str:
    """Format ``template``, turning each escaped ``{{name}}`` into a literal ``{name}``.

    The template is formatted piece by piece between the escapes, so what the values
    hold (a query with braces or NUL bytes) never meets the escapes' rendering."""
    if not isinstance(template, PromptTemplate) or not _ESCAPED.search(template.get_template()):
        return template.format(**kwargs)
    text = template.get_template()
    values = _mapped(template, kwargs)
    pieces: list[str] = []
    done = 0
    for match in _ESCAPED.finditer(text):
        pieces.append(_format_piece(template, text[done : match.start()], values))
        pieces.append("{" + match.group(1) + "}")
        done = match.end()
    pieces.append(_format_piece(template, text[done:], values))
    rendered = "".join(pieces)
    parser = template.output_parser
    return parser.format(rendered) if parser is not None else rendered


def _mapped(template: PromptTemplate, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` over ``template``'s partial values, with each of its function mappings
    called once (as ``format`` calls them: with all those values), so that every piece
    of one rendering shows the same value of a mapped variable."""
    values = {**template.kwargs, **kwargs}
    functions = template.function_mappings or {}
    return {**values, **{name: fn(**values) for name, fn in functions.items()}}


def _format_piece(template: PromptTemplate, piece: str, values: dict[str, Any]) -> str:
    """``piece`` of ``template``'s text formatted as the template would format it, with
    ``values`` (`_mapped`: its function mappings already applied; its variable
    mappings apply here; the output parser's instructions are added once, to the whole
    prompt)."""
    if not piece:
        return ""
    update = {"template": piece, "output_parser": None, "function_mappings": None}
    return template.model_copy(update=update).format(**values)
