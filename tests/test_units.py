import pytest

from jupyter_gpumem.units import format_bytes, format_delta, join_sizes, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 << 30),
        ("24 GiB", 24 << 30),
        ("24GB", 24 * 10**9),
        ("512mib", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("1000", 1000),
        ("7B", 7),
        ("2T", 2 * 10**12),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["12XB", "", "GiB", "-1GiB", "1.2.3GB", "0.1", "24 G iB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_format():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(24 << 30) == "24.00 GiB"
    assert format_bytes(-(1 << 20)) == "-1.00 MiB"
    assert format_bytes(None) == "n/a"
    assert format_delta(1 << 30) == "+1.00 GiB"
    assert format_delta(-512) == "-512 B"
    assert format_delta(0) == "0 B"


def test_a_size_that_rounds_up_is_shown_in_the_next_unit():
    assert format_bytes((1 << 20) - 1) == "1.00 MiB"  # not "1024.00 KiB"
    assert format_bytes((1 << 30) - 1) == "1.00 GiB"
    assert format_bytes(-((1 << 40) - 1)) == "-1.00 TiB"
    assert format_bytes(1023 * 1024 + 1000) == "1023.98 KiB"
    assert format_bytes(5 << 50) == "5120.00 TiB"  # the largest unit


def test_sizes_are_spelled_one_way():
    # GIVEN sizes from one byte to petabytes, each unit's edges included
    sizes = [0, 1, 999, 1000, 1023, 1024, 10**6, 10**9, 24 << 30, 10**12, 5 << 50]
    sizes += [(1 << k) + d for k in range(10, 50, 10) for d in (-1, 0, 1)]
    # WHEN they are shown THEN every unit is B, KiB, MiB, GiB or TiB
    for n in sizes:
        for shown_size in (format_bytes(n), format_delta(n), format_delta(-n)):
            number, unit = shown_size.split(" ")
            assert unit in ("B", "KiB", "MiB", "GiB", "TiB"), shown_size
            float(number)


def test_decimal_units_are_still_read():
    assert [parse_size(t) for t in ("1KB", "1kb", "1 MB", "1GB", "1TB")] == [
        10**3,
        10**3,
        10**6,
        10**9,
        10**12,
    ]


# Decimal units may appear in strings the package writes only where they show what a user
# may type (a size is parsed with them) or name a card as it is sold ("24 GB"): never
# as a size the package measured and formats.
_INPUT_EXAMPLES = {
    "units.py": "parse_size's message lists the units it reads",
    "analysis/targets.py": "cards as they are sold (RTX 4090 (24 GB)) and --fit-in's examples",
    "core/scanner.py": "--fit-in's examples",
    "run/budgets.py": "a budget's accepted forms",
    "run/cli.py": "a budget's accepted forms",
    "_ipython/parsers.py": "the accepted forms of --fit-in",
    "_ipython/command_parsers.py": "the accepted forms of limit",
    "_ipython/commands/limit.py": "the accepted forms of limit",
}


def _string_constants(path):
    """The string literals of a module, docstrings left out (they are not output)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_decimal_or_kb_unit_in_what_the_package_writes():
    import re
    from pathlib import Path

    import jupyter_gpumem

    root = Path(jupyter_gpumem.__file__).parent
    kb = re.compile(r"\bkB\b")
    decimal = re.compile(r"\b(KB|MB|GB|TB)\b")
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        for line, text in _string_constants(path):
            if kb.search(text) or (decimal.search(text) and name not in _INPUT_EXAMPLES):
                found.append(f"{name}:{line}: {text[:80]!r}")
    assert found == []


def test_join_sizes_keeps_number_and_unit_together():
    text = "64.00 MiB -> 1.00 GiB (+512 B), 3 blocks, line 3 Because x1.5 GiB"
    assert join_sizes(text, "&nbsp;") == (
        "64.00&nbsp;MiB -> 1.00&nbsp;GiB (+512&nbsp;B), 3 blocks, line 3 Because x1.5 GiB"
    )
    for n in (0, 512, 1536, 24 << 30, -(1 << 20), 5 << 50):
        assert " " not in join_sizes(format_bytes(n), "&nbsp;")
