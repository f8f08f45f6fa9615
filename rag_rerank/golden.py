"""The golden regression runner: `golden/<kind>/<name>.json` cases, run offline.

Cases are data, not code, so that a behaviour change shows up as a diff in a reviewed file and
any other implementation of the contract can replay them. Three kinds:

- `render`: a request and what its prompt must (not) contain, or the file it must equal byte for
  byte; every render case also checks the injection invariants (the chunks section decodes back
  to exactly the caller's records, one line per chunk, no '<' in it, one `<query>` element) —
  or `expect_error`: substrings the input guard's violations must contain.
- `check`: chunks, top_k and a recorded raw LLM output that the output guard must accept
  (`"expect": "valid"`) or reject with violations containing each `expect_violations` substring;
  `"repair": true` runs the formatting salvage first (`expect_repairs` pins what it reports).
- `rerank`: a request run through `rag_rerank.rerank.rerank` (local backend by default) whose
  ranked ids and dropped reasons must match `expect`.

A case that cannot even be read is a failure, never a crash. A case that needs an optional
package that is not installed is reported as skipped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .api import rerank
from .errors import InputError, MissingDependencyError, RerankError
from .guard import parse_chunks, validate_request
from .guard.output import judge
from .guard.repair import repair_output
from .paths import golden_dir
from .render import extract_chunk_lines, render
from .wording import counted

KINDS = ("render", "check", "rerank")

_COMMON_KEYS = {"description", "notes"}
_ALLOWED_KEYS: dict[str, set[str]] = {
    "render": _COMMON_KEYS
    | {"query", "chunks", "top_k", "lambda", "expected_file", "expect_contains", "expect_not_contains",
       "expect_error"},
    "check": _COMMON_KEYS
    | {"chunks", "top_k", "raw", "repair", "expect", "expect_violations", "expect_repairs", "expect_object",
       "query"},
    "rerank": _COMMON_KEYS
    | {"query", "chunks", "top_k", "lambda", "backend", "embedder", "options", "expect", "expect_error"},
}
_REQUIRED_KEYS: dict[str, set[str]] = {
    "render": {"description", "query", "chunks"},
    "check": {"description", "chunks", "top_k", "raw", "expect"},
    "rerank": {"description", "query", "chunks"},
}


class CaseFormatError(RerankError):
    """A golden case file that does not follow the format (a failure of that case, not a crash)."""


@dataclass(frozen=True)
class GoldenCase:
    """One case file, parsed."""

    kind: str
    name: str
    path: Path
    data: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class CaseResult:
    """What running one case found: no failures means it passed."""

    label: str
    failures: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures


_STRING_LIST_KEYS = frozenset(
    {"expect_contains", "expect_not_contains", "expect_error", "expect_violations", "expect_repairs"})


def load_case(path: Path, kind: str) -> GoldenCase:
    """Read and shape-check one case file; `CaseFormatError` says what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM from a Windows editor is fine
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CaseFormatError(f"cannot read case: {exc}") from None
    if not isinstance(data, dict):
        raise CaseFormatError("a case must be a JSON object")
    unknown = set(data) - _ALLOWED_KEYS[kind]
    if unknown:
        raise CaseFormatError(f"unknown key(s) for a {kind} case: {sorted(unknown)}")
    missing = _REQUIRED_KEYS[kind] - set(data)
    if missing:
        raise CaseFormatError(f"missing key(s) for a {kind} case: {sorted(missing)}")
    for key in _STRING_LIST_KEYS & set(data):
        # a bare string would be checked character by character: "score" would pass on any 's'
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise CaseFormatError(f"{key!r} must be a list of strings, got {json.dumps(value)[:60]}")
    return GoldenCase(kind=kind, name=path.stem, path=path, data=data)


def discover(root: Path) -> list[tuple[str, Path]]:
    """(kind, file) for every case under `root`, in a stable order. Other folders are not cases."""
    return [(kind, p) for kind in KINDS for p in sorted((root / kind).glob("*.json"))]


def _chunks_source(value: Any) -> Any:
    """Chunks as the case gives them: a JSONL string or a list of records."""
    if isinstance(value, (str, list)):
        return value
    raise CaseFormatError("'chunks' must be a JSONL string or a list of records")


def _violation_strings(violations: Sequence[Any]) -> list[str]:
    return [str(v) for v in violations]


def _missing_substrings(wanted: Sequence[str], found: Sequence[str]) -> list[str]:
    return [w for w in wanted if not any(w in f for f in found)]


def _expect_input_error(case: GoldenCase, call: Callable[[], Any]) -> list[str]:
    wanted = case.data["expect_error"]
    try:
        call()
    except InputError as exc:
        found = _violation_strings(exc.violations)
        missing = _missing_substrings(wanted, found)
        return [f"input error lacks {missing}; got {found}"] if missing else []
    return [f"expected an input error containing {wanted}, but the request was accepted"]


# --- render ------------------------------------------------------------------------------------


def _render_invariants(request: Any, prompt: str) -> list[str]:
    """What must hold for every prompt, whatever the caller's text: the injection-safety contract."""

    out: list[str] = []
    for tag in ("<task>", "</task>", "<chunks>", "</chunks>", "<query>", "</query>"):
        if prompt.count(tag) != 1:
            out.append(f"{tag} appears {prompt.count(tag)} times in the prompt, expected once")
    if out:
        return out
    start = prompt.index("<chunks>") + len("<chunks>")
    section = prompt[start : prompt.index("</chunks>")]
    if "<" in section or "]]>" in section:
        out.append("the chunks section holds a raw '<' or ']]>'")
    lines = extract_chunk_lines(prompt)
    if len(lines) != len(request.chunks) or len(section.splitlines()) != len(request.chunks):
        out.append(f"{counted(len(lines), 'chunk line')} for {counted(len(request.chunks), 'chunk')}")
    for line, chunk in zip(lines, request.chunks, strict=False):
        if json.loads(line) != chunk.prompt_record():
            out.append(f"chunk {chunk.id!r} does not decode back to the caller's record: {line[:80]!r}")
    return out


def _run_render(case: GoldenCase) -> list[str]:

    d = case.data
    args = (d["query"], _chunks_source(d["chunks"]), d.get("top_k"), d.get("lambda"))
    if "expect_error" in d:
        return _expect_input_error(case, lambda: validate_request(*args))
    try:
        request = validate_request(*args)
    except InputError as exc:
        return [f"input rejected: {'; '.join(_violation_strings(exc.violations))}"]
    prompt = render(request)
    failures = _render_invariants(request, prompt)
    if "expected_file" in d:
        expected_path = case.path.parent / d["expected_file"]
        try:
            expected = expected_path.read_text(encoding="utf-8")
        except OSError as exc:
            return [*failures, f"cannot read expected_file: {exc}"]
        if prompt != expected:
            failures.append(_first_difference(prompt, expected, expected_path.name))
    failures += [f"prompt lacks {s!r}" for s in d.get("expect_contains", []) if s not in prompt]
    failures += [f"prompt contains {s!r}" for s in d.get("expect_not_contains", []) if s in prompt]
    return failures


def _first_difference(got: str, want: str, name: str) -> str:
    pairs = enumerate(zip(got, want, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
    line = want.count("\n", 0, at) + 1
    return (f"prompt differs from {name} at char {at} (line {line}): got {got[at:at + 30]!r}, "
            f"expected {want[at:at + 30]!r}")


# --- check -------------------------------------------------------------------------------------


def _run_check(case: GoldenCase) -> list[str]:

    d = case.data
    if d["expect"] not in ("valid", "invalid"):
        raise CaseFormatError("'expect' must be \"valid\" or \"invalid\"")
    if isinstance(d["top_k"], bool) or not isinstance(d["top_k"], int):
        raise CaseFormatError(f"'top_k' must be an integer, got {json.dumps(d['top_k'])[:40]}")
    chunks = parse_chunks(_chunks_source(d["chunks"]))
    raw = d["raw"]
    failures: list[str] = []
    if d.get("repair", False):
        fixed = repair_output(raw)
        raw = fixed.text
        wanted = d.get("expect_repairs")
        if wanted == [] and fixed.repairs:  # an empty list pins "no repair at all"
            failures.append(f"expected no repair, but repair reported {list(fixed.repairs)}")
        failures += [f"repair did not report {w!r}; reported {list(fixed.repairs)}"
                     for w in _missing_substrings(wanted or [], fixed.repairs)]
    elif "expect_repairs" in d:
        raise CaseFormatError("'expect_repairs' needs \"repair\": true")
    obj, violations = judge(raw, chunks, d["top_k"], query=d.get("query"))
    found = _violation_strings(violations)
    if d["expect"] == "valid":
        if found:
            failures.append(f"expected valid, got {counted(len(found), 'violation')}: {found}")
        elif "expect_object" in d and obj != d["expect_object"]:
            failures.append(f"accepted object {obj} differs from expect_object")
    else:
        if not found:
            failures.append("expected invalid, but the guard accepted the output")
        failures += [f"no violation mentions {w!r}; got {found}"
                     for w in _missing_substrings(d.get("expect_violations", []), found)]
    return failures


# --- rerank ------------------------------------------------------------------------------------


def _run_rerank(case: GoldenCase) -> list[str]:

    d = case.data
    if not isinstance(d.get("options", {}), dict):
        raise CaseFormatError("'options' must be an object of rerank() keywords")
    options = dict(d.get("options", {}))
    options.setdefault("backend", d.get("backend", "local"))
    options.setdefault("embedder", d.get("embedder", "lexical"))
    args = (d["query"], _chunks_source(d["chunks"]), d.get("top_k"), d.get("lambda"))
    if "expect_error" in d:
        return _expect_input_error(case, lambda: rerank(*args, **options))
    if not isinstance(d.get("expect"), dict):
        raise CaseFormatError("a rerank case needs 'expect': {\"ranked_ids\": [...], \"dropped\": {...}}")
    _check_rerank_expect(d["expect"])
    try:
        result = rerank(*args, **options)
    except InputError as exc:
        return [f"input rejected: {'; '.join(_violation_strings(exc.violations))}"]
    failures: list[str] = []
    expect = d["expect"]
    got_ids = [r.id for r in result.ranked]
    if "ranked_ids" in expect and got_ids != expect["ranked_ids"]:
        failures.append(f"ranked ids {got_ids} != expected {expect['ranked_ids']}")
    got_dropped = {x.id: x.reason for x in result.dropped}
    if "dropped" in expect:
        want: dict[str, str] = expect["dropped"]
        if set(got_dropped) != set(want):
            failures.append(f"dropped ids {sorted(got_dropped)} != expected {sorted(want)}")
        for cid, prefix in want.items():
            if cid in got_dropped and not got_dropped[cid].startswith(prefix):
                failures.append(f"dropped {cid!r} reason {got_dropped[cid]!r} does not start with {prefix!r}")
    input_ids = [str(r.get("id")) for r in _records(d["chunks"])]
    accounted = got_ids + list(got_dropped)
    if sorted(accounted) != sorted(input_ids):
        failures.append(f"ids not accounted for exactly once: input {input_ids}, output {accounted}")
    return failures


def _check_rerank_expect(expect: Mapping[str, Any]) -> None:
    """A misspelt or empty `expect` would leave a case that checks nothing and can never fail."""
    unknown = set(expect) - {"ranked_ids", "dropped"}
    if unknown or not expect:
        raise CaseFormatError(f"'expect' takes 'ranked_ids' and/or 'dropped', got {sorted(expect)}")
    ids = expect.get("ranked_ids", [])
    if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
        raise CaseFormatError("'expect.ranked_ids' must be a list of id strings")
    dropped = expect.get("dropped", {})
    if not isinstance(dropped, dict) or not all(isinstance(x, str) for x in dropped.values()):
        raise CaseFormatError("'expect.dropped' must be an object {id: reason prefix}")


def _records(chunks: Any) -> list[dict[str, Any]]:
    if isinstance(chunks, list):
        return [c for c in chunks if isinstance(c, dict)]
    return [json.loads(line) for line in str(chunks).split("\n") if line.strip()]


_RUNNERS: dict[str, Callable[[GoldenCase], list[str]]] = {
    "render": _run_render,
    "check": _run_check,
    "rerank": _run_rerank,
}


def run_case(case: GoldenCase) -> CaseResult:
    """Run one case; every problem (even a broken case file) comes back as a failure line."""
    try:
        failures = _RUNNERS[case.kind](case)
    except MissingDependencyError as exc:
        return CaseResult(case.label, skipped=str(exc))
    except CaseFormatError as exc:
        failures = [f"bad case file: {exc}"]
    except RerankError as exc:
        failures = [f"{type(exc).__name__}: {' '.join(str(exc).split())}"]
    except Exception as exc:  # a regression that crashes must be reported, not abort the run
        failures = [f"crashed: {type(exc).__name__}: {exc}"]
    return CaseResult(case.label, tuple(failures))


def run_all(root: Path) -> list[CaseResult]:
    """Every case under `root`, run in order."""
    results = []
    for kind, path in discover(root):
        try:
            case = load_case(path, kind)
        except CaseFormatError as exc:
            results.append(CaseResult(f"{kind}/{path.stem}", (f"bad case file: {exc}",)))
            continue
        results.append(run_case(case))
    return results


def run_golden(dir: Path | str | None = None, verbose: bool = False, *,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the golden cases; one line per failing case on stderr, a summary on stdout.

    Exit code: 0 all passed, 1 any case failed, 2 no such folder or no cases in it.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    root = Path(dir) if dir is not None else golden_dir()
    if not root.is_dir():
        print(f"rag-rerank: golden: no such folder: {root}", file=err)
        return 2
    results = run_all(root)
    if not results:
        print(f"rag-rerank: golden: no cases in {root} (expected {', '.join(KINDS)}/<name>.json)", file=err)
        return 2
    failed = [r for r in results if not r.ok]
    skipped = [r for r in results if r.skipped]
    for r in results:
        if not r.ok:
            print(f"FAIL {r.label}: " + " | ".join(' '.join(f.split()) for f in r.failures), file=err)
        elif verbose:
            print(f"{'skip' if r.skipped else 'ok  '} {r.label}" + (f": {r.skipped}" if r.skipped else ""),
                  file=out)
    by_kind = ", ".join(f"{k} {sum(r.label.startswith(k + '/') for r in results)}" for k in KINDS)
    passed = len(results) - len(failed) - len(skipped)
    print(f"golden: {passed} passed, {len(failed)} failed, {len(skipped)} skipped ({by_kind}) in {root}",
          file=out)
    return 1 if failed else 0
