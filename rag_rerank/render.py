"""Renders the XML task from the Jinja template.

Injection safety lives here, not in the template: the query is XML-escaped, and each chunk is one
JSON line in which `<`, `>`, `&` and every character that some reader treats as a line break are
written as `\\uXXXX` escapes. A JSON decoder gives back exactly the caller's strings, yet no
caller text can close `</chunks>`, open an element, end a CDATA section or start a new JSONL
record. Values are passed to Jinja as data, so Jinja syntax inside them is never executed.
Invisible characters that can hide instructions from a human reviewer (Unicode tag characters,
bidirectional overrides) are escaped too, so they show as visible escape text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

import jinja2
from jinja2 import nodes

from .models import Chunk, RerankRequest
from .paths import prompts_dir
from .text import is_latin1

TEMPLATE_NAME = "rag-chunk-reranker.xml.j2"
# The one-passage yes/no question of log-probability scoring (`OpenAIBackend(scoring="logprobs")`).
RELEVANCE_TEMPLATE = "rag-chunk-relevance.xml.j2"

# Characters that must never appear raw in a chunk line: markup, and line breaks other than the
# record separator (str.splitlines and some tokenizers split on all of these).
_JSON_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
        "\x85": "\\u0085",
        "\x1c": "\\u001c",
        "\x1d": "\\u001d",
        "\x1e": "\\u001e",
        "\x0b": "\\u000b",
        "\x0c": "\\u000c",
    }
)
# Invisible characters that hide text from a person reviewing a prompt or a chunk store while a
# model still reads it: Unicode tag characters (U+E0000-E007F, "ASCII smuggling": each one is an
# ASCII letter in disguise) and the bidirectional embeddings, overrides and isolates that display
# text in another order than the model reads it. In a chunk line they are JSON escapes (surrogate
# pairs for the tag block), in the query character references: the model sees visible escape text,
# and a JSON or XML decoder still gives back the caller's exact string.
_INVISIBLE = (*range(0xE0000, 0xE0080), *range(0x202A, 0x202F), *range(0x2066, 0x206A))


def _json_escape(cp: int) -> str:
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    high, low = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
    return f"\\u{high:04x}\\u{low:04x}"


_JSON_ESCAPES.update({cp: _json_escape(cp) for cp in _INVISIBLE})
_XML_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{chr(cp): f"&#x{cp:X};" for cp in _INVISIBLE}}
)


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(prompts_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,  # the task ends with a newline, byte for byte as in the card
        auto_reload=False,  # the templates ship with the package: no file check on every render
    )


# The ASCII characters the table above rewrites: an ASCII line holding none of them (most lines)
# needs no translation, found by a few substring scans (a regular expression over the whole table's
# characters cost more than the translation it saved).
_ASCII_ESCAPED = tuple(chr(cp) for cp in sorted(_JSON_ESCAPES) if cp < 128)
# The same for a Latin-1 line (most of the rest: accents, and mojibake such as "â\x80\x99"): the
# table's characters below U+0100 are the only ones it can hold.
_LATIN1_ESCAPED = tuple(chr(cp) for cp in sorted(_JSON_ESCAPES) if cp < 256)
# Any character of the table, for a line that is not plain ASCII (a fifth of DL19's passages):
# `str.translate` looks every character of the line up in the table's dict (about 100 K
# instructions for a passage of 1,200 characters), a character class scans in C and only the few
# characters found are replaced, each by the table's own text: the same line.
def _char_class(points: Iterable[int]) -> str:
    """A regular expression's character class of `points`, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for cp in sorted(points):
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    parts = (re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "") for a, b in runs)
    return "[" + "".join(parts) + "]"


_ESCAPED = re.compile(_char_class(_JSON_ESCAPES))


def _escaped(found: re.Match[str]) -> str:
    return _JSON_ESCAPES[ord(found.group())]  # type: ignore[no-any-return]


def chunk_line(chunk: Chunk) -> str:
    """One chunk as a single, markup-free JSON line."""
    if chunk.meta is None:  # memoised: the same chunk recurs (in a corpus, a window's survivors)
        score = chunk.score
        if score is None or (type(score) is float and score):  # what the input guard makes (0.0 aside)
            return _plain_line(chunk.id, chunk.text, score)
        return _spelled_line(chunk.id, chunk.text, score, repr(score))
    return _line(chunk.prompt_record())


@lru_cache(maxsize=4096)
def _plain_line(cid: str, text: str, score: float | None) -> str:
    """The line of a chunk without meta whose score is None or a non-zero float: two such scores
    that are equal are written alike (only 0.0 and -0.0 are equal floats written differently),
    so the key needs no spelling of the score (`_spelled_line`).

    Written field by field (`_line` of the record, without the record, the encoder's pass over the
    text and the scans for characters to escape): `_line` escapes character by character, and the
    record's keys, punctuation and a finite float's repr (what the encoder writes for one) hold
    none of those characters, so the line is its fields' JSON strings (`_json_string`) in the
    record's order. A property test holds it to `_line`."""
    if score is None:
        scored = ""
    elif math.isfinite(score):
        scored = f', "score": {float.__repr__(score)}'
    else:  # NaN, Infinity: as the encoder spells them
        return _line(Chunk(cid, text, score).prompt_record())
    return f'{{"id": {_json_string(cid)}, "text": {_json_string(text)}{scored}}}'


def _written_as_is(cp: int) -> bool:
    """Whether a chunk line writes the character `cp` as itself: json.dumps does not escape it (the
    quotation mark, the backslash and C0 controls it does) and the table above does not rewrite it."""
    return cp not in _JSON_ESCAPES and json.dumps(chr(cp), ensure_ascii=False) == f'"{chr(cp)}"'


# A bytes table that keeps each Latin-1 character written as itself and changes every other one:
# a Latin-1 text's bytes come through it unchanged exactly when the text holds nothing to write
# otherwise (bytes.translate's loop without deletions: a table look-up a byte, no output made
# when nothing changed).
_CHANGES_OTHERS = bytes(cp if _written_as_is(cp) else (cp + 1) % 256 for cp in range(256))


def _json_string(value: str) -> str:
    """`value` as a chunk line writes it (`_line`: its JSON string, escaped by the table): for a
    Latin-1 text holding no character written otherwise (most ids and texts) the text between
    quotation marks, found by one bytes translation (json's encoder reads every character twice,
    and the escape test scanned the line once for each character of the table)."""
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        raw = None
    if raw is not None and raw.translate(_CHANGES_OTHERS) == raw:
        return f'"{value}"'
    return _ESCAPED.sub(_escaped, _ENCODER.encode(value))


@lru_cache(maxsize=1024)
def _spelled_line(cid: str, text: str, score: float | None, score_repr: str) -> str:
    """`_plain_line` of any other score: `score_repr` keeps apart keys equal as numbers but
    written differently (1, 1.0, True, 0.0, -0.0)."""
    return _line(Chunk(cid, text, score).prompt_record())


# `json.dumps(record, ensure_ascii=False)` without building its encoder again for each line (a
# non-default argument makes json.dumps construct one per call): the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _line(record: dict[str, object]) -> str:
    # ensure_ascii=False keeps non-English text readable for the model; json.dumps already
    # escapes \n, \r, \t and other C0 controls, and the table above handles the rest.
    line = _ENCODER.encode(record)
    if line.isascii():
        if not any(ch in line for ch in _ASCII_ESCAPED):
            return line
    elif is_latin1(line) and not any(ch in line for ch in _LATIN1_ESCAPED):
        return line
    return _ESCAPED.sub(_escaped, line)


def chunks_jsonl(chunks: Iterable[Chunk]) -> str:
    """The chunks' lines, each ended by a line break (joined in C: no string built per line). A
    chunk's memoised line is looked up here, `chunk_line`'s first case without its call (each
    chunk of each prompt passes here)."""
    lines = []
    for chunk in chunks:
        score = chunk.score
        if chunk.meta is None and (score is None or (type(score) is float and score)):
            lines.append(_plain_line(chunk.id, chunk.text, score))
        else:
            lines.append(chunk_line(chunk))
    return "\n".join(lines) + "\n" if lines else ""


def xml_text(value: str) -> str:
    """`value` with markup and invisible characters escaped. An ASCII text without `&`, `<` or `>`
    (most queries) has nothing to escape and is returned as it is: `str.translate` with a table
    that lengthens characters looks each character up in the table's dict."""
    if value.isascii() and "<" not in value and ">" not in value and "&" not in value:
        return value
    return value.translate(_XML_ESCAPES)


def format_lambda(value: float) -> str:
    return repr(float(value))


@dataclass(frozen=True)
class _Substitution:
    """A template that only puts values into text: its text pieces around the names it reads
    (`texts` has one more item than `names`). Filled by joining the pieces with the values: one
    C join, where `str.format` parsed the whole template's text again for each prompt."""

    texts: tuple[str, ...]
    names: tuple[str, ...]
    needs: frozenset[str]

    def fill(self, values: Mapping[str, str | int]) -> str:
        """The template's text with each name's value written as Jinja writes it, by `str()`."""
        out = [self.texts[0]]
        for name, text in zip(self.names, self.texts[1:], strict=True):
            out.append(str(values[name]))
            out.append(text)
        return "".join(out)


def _substitution_form(env: jinja2.Environment, source: str) -> _Substitution | None:
    """A template that only puts values into text (`{{ name }}`, comments, white-space control; no
    tag, filter, attribute or expression) as its pieces and names, read from Jinja's own parse;
    None for any other template. Jinja writes such a template's value with `str()` (autoescape
    off), as `_Substitution.fill` does: the same text, without a template context and a generator
    per prompt."""
    texts: list[str] = [""]
    names: list[str] = []
    for node in env.parse(source).body:
        if type(node) is not nodes.Output:
            return None
        for child in node.nodes:
            if type(child) is nodes.TemplateData:
                texts[-1] += child.data
            elif type(child) is nodes.Name and child.ctx == "load":
                names.append(child.name)
                texts.append("")
            else:
                return None
    return _Substitution(tuple(texts), tuple(names), frozenset(names))


@lru_cache(maxsize=16)
def _substitution(template: str) -> _Substitution | None:
    """`_substitution_form` of a packaged template, read once (the templates ship with the package
    and are not reloaded: `auto_reload=False`)."""
    env = _environment()
    assert env.loader is not None  # set in `_environment`
    source, _, _ = env.loader.get_source(env, template)
    return _substitution_form(env, source)


def _render(template: str, values: dict[str, str | int]) -> str:
    """`template` filled with `values`: by its pieces when it is a plain substitution and every
    name it reads is given, else by Jinja (which then names what is missing)."""
    form = _substitution(template)
    if form is not None and form.needs <= values.keys():
        return form.fill(values)
    return _environment().get_template(template).render(values)


def render(request: RerankRequest, template: str = TEMPLATE_NAME) -> str:
    """The complete `<task>…</task>` prompt for a guarded request."""
    return _render(template, {
        "query": xml_text(request.query),
        "chunks": chunks_jsonl(request.chunks),
        "top_k": int(request.top_k),
        "lambda_": format_lambda(request.lambda_),
    })


def render_relevance(query: str, chunk: Chunk, template: str = RELEVANCE_TEMPLATE) -> str:
    """The yes/no relevance question about one chunk (log-probability scoring), escaped as the
    reranking task is: the query XML-escaped, the chunk one markup-free JSON record."""
    return _render(template, {"query": xml_text(query), "passage": chunk_line(chunk)})


def extract_chunk_lines(prompt: str) -> list[str]:
    """The JSONL lines of a rendered prompt's `<chunks>` element (for tests and debugging)."""
    start = prompt.index("<chunks>") + len("<chunks>")
    end = prompt.index("</chunks>", start)
    body = prompt[start:end]
    return [line for line in body.split("\n") if line]
