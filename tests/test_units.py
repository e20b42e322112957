import pytest

from jupyter_gpumem.units import format_bytes, format_delta, parse_size


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
    assert format_bytes(1_610_612_736, "decimal") == "1.61 GB"
    assert format_bytes(None) == "n/a"
    assert format_delta(1 << 30) == "+1.00 GiB"
    assert format_delta(-512) == "-512 B"
    assert format_delta(0) == "0 B"
