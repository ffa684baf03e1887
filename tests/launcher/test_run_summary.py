"""The lines `areal train` prints at the end of a run, from its metrics.jsonl."""

from __future__ import annotations

import json

from areal_cli.launcher.run import summarize


def _write(tmp_path, rows):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_reports_reward_and_the_token_weighted_logprob_gap(tmp_path, capsys):
    rows = [{"step": i, "reward_mean": 0.1 * i, "wall_time_s": 10.0 * (i + 1)} for i in range(4)]
    rows[0].update(logp_gap_fresh=0.03, fresh_tokens=100)
    rows[2].update(logp_gap_fresh=0.01, fresh_tokens=300)
    _write(tmp_path, rows)
    summarize(tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("done: 4 steps in 40s; mean reward first quarter 0.000 → last quarter "
                             "0.300")
    assert out[1] == ("behaviour vs trainer logprobs, same weights: mean |difference| 0.0150 over "
                      "400 tokens")


def test_summary_flags_a_large_gap_and_omits_a_missing_one(tmp_path, capsys):
    _write(tmp_path,
           [{"step": 0, "reward_mean": 0.5, "wall_time_s": 3.0, "logp_gap_fresh": 0.4,
             "fresh_tokens": 9}])
    summarize(tmp_path)
    assert "far apart" in capsys.readouterr().out
    _write(tmp_path, [{"step": 0, "reward_mean": 0.5, "wall_time_s": 3.0}])
    summarize(tmp_path)
    assert len(capsys.readouterr().out.splitlines()) == 1
