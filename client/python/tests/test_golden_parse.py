"""The budget, input-spec and loss strings of tests/golden/budgets.txt
through mutwo's parse_budget, parse_tensor_spec and parse_loss; tests/common/parse_golden_test.cc
reads the same file through the C++ parsers (the CLI's and the server's), so
the two cannot drift apart without one of them failing."""
from __future__ import annotations

import os
from typing import List, NamedTuple

import pytest

from mutwo import _specs
from mutwo.v1 import types_pb2

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "..", "..", "..", "tests", "golden", "budgets.txt")
_DTYPE_NAMES = {v: k for k, v in _specs._DTYPES.items()}


class Case(NamedTuple):
    line: int
    kind: str
    text: str
    expected: str


def _read_corpus() -> List[Case]:
    cases = []
    with open(CORPUS, encoding="utf-8") as f:
        for n, line in enumerate(f.read().splitlines(), 1):
            if not line or line.startswith("#"):
                continue
            fields = line.split(" | ")
            assert len(fields) == 3, "%s:%d: %r" % (CORPUS, n, line)
            cases.append(Case(n, *fields))
    return cases


def _g(x: float) -> str:
    """A number as C++'s absl::StrCat prints a double (%g, 6 digits)."""
    return "%g" % x


def _budget_outcome(b: types_pb2.MemoryBudget) -> str:
    kind = b.WhichOneof("kind")
    if kind == "bytes":
        return "bytes=%d" % b.bytes
    if kind in ("fraction_of_baseline", "fraction_of_device"):
        return "%s=%s" % (kind, _g(getattr(b, kind)))
    if kind == "knee":
        return "knee"
    return str(kind)


def _spec_outcome(s: types_pb2.TensorSpec) -> str:
    dims = ",".join("B" if d == _specs.BATCH_DIM else str(d) for d in s.dims)
    out = "%s:%s[%s]" % (s.name, _DTYPE_NAMES[s.dtype], dims)
    if s.HasField("range"):
        out += "{%s,%s}" % (_g(s.range.low), _g(s.range.high))
    return out


CASES = _read_corpus()
PARSERS = {"budget": (_specs.parse_budget, _budget_outcome),
           "spec": (_specs.parse_tensor_spec, _spec_outcome),
           "loss": (_specs.parse_loss, _specs.format_loss)}


def test_corpus_has_budgets_specs_and_losses() -> None:
    kinds = [c.kind for c in CASES]
    assert set(kinds) == {"budget", "spec", "loss"}
    assert kinds.count("budget") >= 20 and kinds.count("spec") >= 20
    assert kinds.count("loss") >= 15


@pytest.mark.parametrize("case", CASES,
                         ids=["%d:%s" % (c.line, c.text) for c in CASES])
def test_parser_gives_the_corpus_outcome(case: Case) -> None:
    parse, outcome = PARSERS[case.kind]
    if case.expected.startswith("error"):
        part = case.expected[len("error"):].strip()
        with pytest.raises(ValueError) as err:
            got = parse(case.text)
            pytest.fail("accepted as %s" % outcome(got))
        assert part in str(err.value)
    else:
        assert outcome(parse(case.text)) == case.expected
