"""File and datasets-directory task sources, on small files written here."""

import json

import pytest

from areal_cli.config.task import TaskConfig
from areal_cli.tasks import Problem, load_problems

RECORDS = [
    {"q": f"What is {i} + 1?", "a": i + 1, "uid": f"p{i}", "level": i % 3} for i in range(10)
]


def cfg_for(path, **kw) -> TaskConfig:
    base = dict(
        name="mine", source="file", path=str(path), prompt_field="q", answer_field="a",
        eval_size=3, size=0, instruction="Answer: <n>",
    )  # fmt: skip
    return TaskConfig(**{**base, **kw})


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_split_is_disjoint_and_complete(tmp_path):
    cfg = cfg_for(write_jsonl(tmp_path / "d.jsonl", RECORDS))
    train, ev = load_problems(cfg, "train"), load_problems(cfg, "eval")
    assert len(train) == 7 and len(ev) == 3
    assert {p.id for p in train}.isdisjoint(p.id for p in ev)
    assert {p.id for p in train + ev} == {f"mine/{i}" for i in range(10)}
    p = train[0]
    assert p.prompt.startswith("What is") and p.prompt.endswith("\n\nAnswer: <n>")
    assert p.answer == str(int(p.prompt.split()[2]) + 1)  # numbers become text
    assert p.meta == {"uid": p.meta["uid"], "level": p.meta["level"]}
    assert Problem.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert load_problems(cfg_for(cfg.path, seed=1), "eval") != ev  # another seed, other split


def test_json_and_parquet_match_jsonl(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "d.json").write_text(json.dumps(RECORDS))
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "d.parquet")
    reference = load_problems(cfg_for(write_jsonl(tmp_path / "d.jsonl", RECORDS)), "train")
    for name in ("d.json", "d.parquet"):
        assert load_problems(cfg_for(tmp_path / name), "train") == reference


def test_id_field_and_eval_path(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", RECORDS[:6])
    held = write_jsonl(tmp_path / "eval.jsonl", RECORDS[6:])
    cfg = cfg_for(train, eval_path=str(held), id_field="uid", size=4, eval_size=0)
    assert [p.id for p in load_problems(cfg, "train")] == ["p0", "p1", "p2", "p3"]
    assert [p.id for p in load_problems(cfg, "eval")] == ["p6", "p7", "p8", "p9"]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n\n" + '{"q": "x", "a": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl line 3: not valid JSON.*fix or delete"):
        load_problems(cfg_for(path), "train")


def test_missing_field_lists_fields_present(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1+1", "a": 2}])
    with pytest.raises(ValueError, match=r"line 1: missing field 'q'; fields present: \['a', 'q"):
        load_problems(cfg_for(path, eval_size=0), "train")


def test_empty_and_duplicate_ids(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: the dataset is empty"):
        load_problems(cfg_for(empty), "train")
    same_uid = [RECORDS[0], {**RECORDS[1], "uid": "p0"}, *RECORDS[2:]]
    dup = write_jsonl(tmp_path / "dup.jsonl", same_uid)
    with pytest.raises(ValueError, match="duplicate id 'p0'"):
        load_problems(cfg_for(dup, id_field="uid", eval_size=1, seed=3), "train")
    one = write_jsonl(tmp_path / "one.jsonl", [RECORDS[0], RECORDS[0]])  # one distinct problem
    with pytest.raises(ValueError, match=r"the train split is empty \(2 records, 1 distinct"):
        load_problems(cfg_for(one, eval_size=0), "train")


def test_hf_disk_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(RECORDS)
    ds.save_to_disk(str(tmp_path / "plain"))
    cfg = cfg_for(tmp_path / "plain", source="hf_disk")
    assert len(load_problems(cfg, "train")) == 7 and len(load_problems(cfg, "eval")) == 3
    dd = datasets.DatasetDict(train=ds.select(range(8)), test=ds.select(range(8, 10)))
    dd.save_to_disk(str(tmp_path / "dict"))
    cfg = cfg_for(tmp_path / "dict", source="hf_disk", id_field="uid")
    assert [p.id for p in load_problems(cfg, "eval")] == ["p8", "p9"]
    assert len(load_problems(cfg, "train")) == 8


def test_validate_names_keys(tmp_path):
    errors = cfg_for(tmp_path / "nope.jsonl").validate()
    assert errors == [
        f"task.path='{tmp_path / 'nope.jsonl'}' does not exist: give an existing path"
    ]
    (tmp_path / "d.csv").write_text("q,a\n")
    assert "task.path" in cfg_for(tmp_path / "d.csv").validate()[0]
    assert TaskConfig(source="ftp").validate()[0].startswith("task.source='ftp': use one of")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_bad_byte_names_the_file_and_line(tmp_path, suffix):
    """Before: "'utf-8' codec can't decode byte 0xff in position 71", naming neither."""
    path = tmp_path / f"d{suffix}"
    lines = [json.dumps(r) for r in RECORDS[:3]]
    body = "\n".join(lines) + "\n" if suffix == ".jsonl" else "[\n" + ",\n".join(lines) + "\n]\n"
    raw = body.encode().replace(b'"What is 1', b'"What is \xff1')
    path.write_bytes(raw)
    line = 2 if suffix == ".jsonl" else 3
    with pytest.raises(ValueError,
                       match=rf"{path} line {line}: not UTF-8 \(byte 0xff at column \d+\)"):
        load_problems(cfg_for(path), "train")


@pytest.mark.parametrize(("line", "why"), [
    ('{"q": "x", "a": NaN}', "NaN is not a JSON number"),
    ('{"q": "x", "a": 1e999}', r"the answer \('a'\) is inf, not a finite number"),
    ('{"q": "x", "a": ' + "9" * 5000 + "}", "Exceeds the limit"),
    ('{"q": "x", "a": "1", "m": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested deeper than the JSON parser's limit"),
    ('{"q": "   ", "a": "1"}', r"the prompt \('q'\) is empty"),
])
def test_a_bad_record_is_named_with_its_line(tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl line 2: .*{why}"):
        load_problems(cfg_for(path), "train")


def test_a_line_past_the_bound_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from areal_cli.tasks import files

    monkeypatch.setattr(files, "MAX_LINE_BYTES", 1 << 10)
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + '{"q": "' + "x" * 5000 + '", "a": "1"}\n')
    with pytest.raises(ValueError, match=r"long\.jsonl line 2: longer than 1,024 bytes"):
        load_problems(cfg_for(path), "train")
