from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from llama_index_hyde_plus.evaluation import load_beir, run_eval
from llama_index_hyde_plus.evaluation.report import markdown, rich_table, write_outputs
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

TINY = Path(__file__).parent / "data" / "tiny-beir"


def result(tmp_path: Path):  # type: ignore[no-untyped-def]
    llm = ScriptedLLM(respond=lambda p: "Enterprise renewals slipped.")
    return run_eval(
        load_beir(TINY),
        ["none", "hyde"],
        llm=llm,
        embed_model=DeterministicEmbedding(),
        embed_label="det",
        cache_root=tmp_path,
        config={"concurrency": 4},
    )


def test_outputs_are_written(tmp_path: Path) -> None:
    res = result(tmp_path)
    paths = write_outputs(res, tmp_path / "out", command="hyde-plus eval --dataset x")
    assert [p.name for p in paths] == ["results.json", "results.md", "results.png"]
    data = json.loads(paths[0].read_text())
    assert data["command"] == "hyde-plus eval --dataset x"
    assert [r["transform"] for r in data["results"]] == ["none", "hyde"]
    assert {
        "nDCG@10",
        "R@10",
        "R@100",
        "RR@10",
        "latency_p50_s",
        "cost_usd",
        "p_value_vs_none",
    } <= set(data["results"][1])
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths[1].read_text()
    assert "| transform | nDCG@10 | Recall@10 | Recall@100 | MRR@10 |" in md
    assert md.count("\n| ") >= 3


def test_terminal_table_fits_80_columns_with_every_header_and_the_changed_share(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    res.reports[1].label = "hyde:include_query=true,question_weight=0.7"
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "transform" in line)
    for name in ("transform", "nDCG@10", "Δ pts [95% CI]", "W/T/L", "chg", "skip/fb", "p50"):
        assert name in header, name
    changed = res.reports[1].changed
    assert 0 < changed <= res.reports[1].queries  # the scripted passage moves rankings
    assert f"{100 * changed / res.reports[1].queries:.0f}%" in text
    assert "…" not in text  # nothing cut off


def test_results_json_has_per_question_scores_and_the_changed_count(tmp_path: Path) -> None:
    res = result(tmp_path)
    data = json.loads(write_outputs(res, tmp_path / "out")[0].read_text())
    hyde = data["results"][1]
    assert hyde["changed_rankings"] == res.reports[1].changed
    assert set(hyde["per_query_ndcg@10"]) == set(res.reports[1].per_query_ndcg)
    assert all(0 <= v <= 1 for v in hyde["per_query_ndcg@10"].values())


def test_terminal_table_lists_every_transform(tmp_path: Path) -> None:
    console = Console(width=200, record=True)
    console.print(rich_table(result(tmp_path)))
    text = console.export_text()
    assert "none" in text and "hyde" in text and "nDCG@10" in text
    assert "hyde" in markdown(result(tmp_path))


def test_outputs_are_overwritten_when_this_tool_wrote_them(tmp_path: Path) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out, command="first")
    write_outputs(res, out, command="second")  # a re-run into the same folder
    assert json.loads((out / "results.json").read_text())["command"] == "second"
    assert "second" in (out / "results.md").read_text()


def test_a_results_file_someone_else_wrote_is_never_overwritten(tmp_path: Path) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    (out / "results.md").write_text("# My own results\n")  # edited by hand: now theirs
    with pytest.raises(ValueError, match=r"results\.md exists and is not an eval report"):
        write_outputs(res, out)
    assert (out / "results.md").read_text() == "# My own results\n"


def test_results_edited_by_hand_are_theirs_and_never_overwritten(tmp_path: Path) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    md = out / "results.md"
    md.write_text(md.read_text() + "\nMy analysis: the gain is real.\n")
    with pytest.raises(ValueError, match=r"results\.md exists and is not an eval report"):
        write_outputs(res, out)
    assert md.read_text().endswith("My analysis: the gain is real.\n")
    md.unlink()
    data = json.loads((out / "results.json").read_text())
    data["notes"] = "irreplaceable"
    (out / "results.json").write_text(json.dumps(data, indent=2))
    with pytest.raises(ValueError, match=r"results\.json exists and is not eval results"):
        write_outputs(res, out)
    assert json.loads((out / "results.json").read_text())["notes"] == "irreplaceable"


def test_results_re_indented_by_hand_are_theirs_even_with_the_same_content(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    results = out / "results.json"
    reformatted = json.dumps(json.loads(results.read_text()), indent=4)
    results.write_text(reformatted)
    with pytest.raises(ValueError, match=r"results\.json exists and is not eval results"):
        write_outputs(res, out)
    assert results.read_text() == reformatted


def test_a_re_run_replaces_results_atomically_so_hard_links_keep_the_old_run(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    out, archive = tmp_path / "out", tmp_path / "archive"
    write_outputs(res, out, command="first run")
    archive.mkdir()
    for name in ("results.json", "results.md", "results.png"):
        os.link(out / name, archive / name)
    before = {p.name: p.read_bytes() for p in archive.iterdir()}
    write_outputs(res, out, command="second run")
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == before
    assert "second run" in (out / "results.md").read_text()
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_chart_edited_by_hand_is_theirs_even_with_our_metadata_kept(tmp_path: Path) -> None:
    """An image editor that keeps the PNG's text chunks but changes pixels makes the
    chart the user's: the seal records the image data's sha256."""
    import zlib

    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    png = (out / "results.png").read_bytes()
    i = png.index(b"IDAT") + 4  # flip one byte of the image data, fix the chunk's CRC
    length = int.from_bytes(png[i - 8 : i - 4], "big")
    body = bytearray(png[i : i + length])
    body[len(body) // 2] ^= 0xFF
    crc = zlib.crc32(b"IDAT" + bytes(body)).to_bytes(4, "big")
    edited = png[:i] + bytes(body) + crc + png[i + length + 4 :]
    (out / "results.png").write_bytes(edited)
    with pytest.raises(ValueError, match=r"results\.png exists and is not an eval chart"):
        write_outputs(res, out)
    assert (out / "results.png").read_bytes() == edited


def test_a_chart_the_user_added_a_note_to_is_theirs(tmp_path: Path) -> None:
    """A text chunk (a comment, a caption) or a gamma chunk added after the image data
    makes the chart the user's too: the seal covers every chunk, not the pixels alone."""
    import zlib

    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    png = (out / "results.png").read_bytes()
    body = b"Comment\x00MY NOTES"
    chunk = len(body).to_bytes(4, "big") + b"tEXt" + body
    chunk += zlib.crc32(b"tEXt" + body).to_bytes(4, "big")
    end = png.rindex(b"IEND") - 4
    noted = png[:end] + chunk + png[end:]
    (out / "results.png").write_bytes(noted)
    with pytest.raises(ValueError, match=r"results\.png exists and is not an eval chart"):
        write_outputs(res, out)
    assert (out / "results.png").read_bytes() == noted


def test_a_full_disk_while_writing_results_leaves_the_old_run_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out, command="first run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_open = os.open

    def full_at_the_chart(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path).name.startswith(".results.png."):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_at_the_chart)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(res, out, command="second run")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no run mixed, no .tmp


def test_a_few_bytes_appended_to_the_chart_make_it_theirs(tmp_path: Path) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    with (out / "results.png").open("ab") as chart:
        chart.write(b"MINE")  # fewer bytes than a chunk header
    tagged = (out / "results.png").read_bytes()
    with pytest.raises(ValueError, match=r"results\.png exists and is not an eval chart"):
        write_outputs(res, out)
    assert (out / "results.png").read_bytes() == tagged


def test_an_eval_ends_with_one_recommendation_a_user_can_act_on(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = result(tmp_path)
    hyde = res.reports[1]
    hyde.label, hyde.queries = "hyde:question_weight=0.7", 300
    hyde.delta_vs_none, hyde.p_value_vs_none, hyde.interval_vs_none = 0.021, 0.004, (0.008, 0.034)
    hyde.wins, hyde.ties, hyde.losses, hyde.fallbacks = 40, 240, 20, 0
    said = recommendation(res)
    assert said.startswith("Recommendation: use `hyde:question_weight=0.7`")
    assert "+2.1 [+0.8,+3.4]" in said and "p = 0.004" in said

    hyde.p_value_vs_none = 0.3  # a gain that could be chance
    said = recommendation(res)
    assert said.startswith("Recommendation: keep plain search (`none`)")
    assert "no transform gains significantly" in said and "p = 0.30" in said

    hyde.p_value_vs_none, hyde.fallbacks = 0.004, 31  # the score is partly plain search's
    said = recommendation(res)
    assert "keep plain search" in said and "31 of 300 queries fell back" in said
    assert said in markdown(res)


def test_the_chart_labels_say_how_many_queries_fell_back_or_changed(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.report import delta_label

    hyde = result(tmp_path).reports[1]
    hyde.queries, hyde.changed, hyde.skipped, hyde.fallbacks = 300, 150, 12, 23
    label = delta_label(hyde)
    assert "50% changed" in label and "12 skipped" in label and "23 fell back" in label


def test_titles_count_chunks_for_questions_written_from_chunks(tmp_path: Path) -> None:
    res = result(tmp_path)
    res.unit = "chunks"
    assert f"{res.documents} chunks" in markdown(res)
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    assert f"{res.documents} chunks" in console.export_text()
