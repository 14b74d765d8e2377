"""A multiple-choice lm-evaluation-harness task written for the tests, and a corpus that teaches its pattern.

The pattern: in the byte-tokenized text, a run of letters of the alphabet, a colon and the letter that comes next
(after z, a): "klmno:p". The task (`pattern`): a run and its colon, and four one-letter continuations, one of them the
next letter: chance is 1/4, a model that learned the pattern picks it. Every context ends with the colon, so an
untrained model's leaning (mostly a function of the last token) is the same for every document. Its YAML reads a local JSONL (dataset_path: json), as a user's task
does offline.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.prepared_data import write_prepared

LETTERS = "abcdefghijklmnopqrstuvwxyz"
EOD = 256
TASK = "pattern"
CHOICES = 4


def _run_of_letters(rng: random.Random, length: int) -> str:
    start = rng.randrange(len(LETTERS))
    return "".join(LETTERS[(start + i) % len(LETTERS)] for i in range(length))


def write_pattern_data(root: Path, docs: int = 400, seed: int = 0) -> Path:
    """A prepared dataset (bytes tokenizer, vocabulary 257) of documents that follow the pattern."""
    rng = random.Random(seed)

    def stream(n: int) -> list[int]:
        ids: list[int] = []
        for _ in range(n):
            segments = [_run_of_letters(rng, rng.randrange(3, 8)) for _ in range(rng.randrange(3, 8))]
            text = " ".join(f"{run[:-1]}:{run[-1]}" for run in segments)
            ids += list(text.encode()) + [EOD]
        return ids

    write_prepared(root, [stream(docs)], [stream(docs // 4)])
    return root


def write_pattern_task(directory: Path, docs: int = 200, seed: int = 1, name: str = TASK) -> Path:
    """`directory`/NAME.yaml over `directory`/NAME.jsonl (absolute data_files); the directory, for
    eval.harness.include_path. Documents come in groups of four over the same four letters, each of them right in
    one: an untrained model's leaning towards some letters then counts as often for as against it, and the letters
    are 6 apart, so that no context (at most 5 letters) holds one of them."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(docs // CHOICES):
        offset = rng.randrange(len(LETTERS))
        letters = [LETTERS[(offset + 6 * k) % len(LETTERS)] for k in range(CHOICES)]
        for right in letters:
            end = LETTERS.index(right) - 1
            context = "".join(LETTERS[(end - i) % len(LETTERS)] for i in reversed(range(rng.randrange(2, 6)))) + ":"
            choices = rng.sample(letters, CHOICES)
            rows.append({"context": context, "choices": choices, "gold": choices.index(right)})
    rng.shuffle(rows)
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / f"{name}.yaml").write_text(task_yaml(name, data))
    return directory


def task_yaml(name: str, data_file: Path | str, dataset_path: str = "json") -> str:
    return (f"task: {name}\n"
            f"dataset_path: {dataset_path}\n"
            f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data_file))}\n"
            "test_split: test\n"
            "output_type: multiple_choice\n"
            "doc_to_text: \"{{context}}\"\n"
            "doc_to_choice: choices\n"
            "doc_to_target: gold\n"
            "target_delimiter: \"\"\n"
            "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


def write_more_tasks(directory: Path, name: str = TASK) -> list[str]:
    """Two more tasks over NAME.jsonl in `directory`, for the other request types: NAME_gen (generate_until: the
    next letter, greedy, exact match) and NAME_rolling (loglikelihood_rolling: each run with its answer as a
    document, its perplexity). Their names."""
    data = json.dumps(str(directory / f"{name}.jsonl"))
    head = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n")
    (directory / f"{name}_gen.yaml").write_text(
        f"task: {name}_gen\n{head}output_type: generate_until\ndoc_to_text: \"{{{{context}}}}\"\n"
        "doc_to_target: \"{{choices[gold]}}\"\ntarget_delimiter: \"\"\n"
        "generation_kwargs:\n  until: [\" \"]\n  max_gen_toks: 3\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    (directory / f"{name}_rolling.yaml").write_text(
        f"task: {name}_rolling\n{head}output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
        "doc_to_target: \"{{context}}{{choices[gold]}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    return [f"{name}_gen", f"{name}_rolling"]
