"""What `fecomlite run` prints of a user's strings (regions, parameters, APIs, program names) is
text, never rich markup, and carries no control characters."""

from __future__ import annotations

import io

from rich.console import Console
from test_store import make_batch

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.summary import summary_table
from fecomlite.runtime import batch_codec
from fecomlite.store import Store
from fecomlite.terminal import plain

NASTY = ["[/]", "[link=file:///etc/passwd]click[/link]", "[bold red]x", "a\x1b[2Jb\x07"]


def test_plain_prints_every_string_as_itself_without_control_characters():
    for text in NASTY:
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(f"[bold]{plain(text)}[/]")
        assert out.getvalue().rstrip("\n") == text.replace("\x1b", "").replace("\x07", "")


def test_the_run_summary_prints_regions_parameters_and_programs_as_text(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        run = store.create_run(program="[/]train.py", status="incomplete")
        header, cols = batch_codec.decode(make_batch(
            ["region:[/]", "region:[link=file:///etc/passwd]x"], [(0, 10, 20, 0), (1, 30, 50, 0)],
            hyperparams={"y": "[/]", "[b]": "\x1b]0;title\x07"}))
        store.add_batch(run, header, cols)
        store.put_result(run, "lost_events", {"events": 12})
        store.upsert_repetition(run, 2, t_start_ns=0, t_end_ns=100)
        table = summary_table(analyse_run(store, run))
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(table)
    text = out.getvalue()
    assert "region:[/]" in text and "region:[link=file:///etc/passwd]x" in text
    assert "[/]train.py" in text and "y=[/]" in text and "[b]=]0;title" in text
    assert "incomplete: 12 events lost" in text
    assert "\x1b" not in text and "\x07" not in text


def test_report_and_export_print_a_markup_like_path_as_text(tmp_path):
    """An error naming a user's path (here a store folder named `[bold red]x`) is printed as it
    is, not parsed as markup (which swallowed the brackets, or raised MarkupError on `[/]`)."""
    from cli_runner import invoke

    folder = tmp_path / "[bold red]x"
    folder.mkdir()
    (folder / "s.sqlite").write_bytes(b"not a fecomlite store, nor SQLite at all" * 100)
    for command in (["report"], ["export", "--format", "perfetto"]):
        done = invoke([*command, "--store", str(folder / "s.sqlite")])
        assert done.exit_code == 1, (command, done.output)
        assert "[bold red]x" in " ".join(done.output.split()) and "error" in done.output
