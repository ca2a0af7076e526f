"""The built-in corpus: C4-format JSON-lines made from English text that ships with Python and Debian.

``taskdata cache --task c4_span_corruption`` must work on a fresh machine without network, so the
product carries a *recipe* (this module), not a data file. The recipe gathers paragraphs from fixed
lists of sources, filters them with C4's own line rules, and assembles documents of C4-like length
(log-normal, mean ~2,200 characters) from runs of consecutive paragraphs, with a local RNG per
document.
Lines are exactly allenai/c4's (``{"text":...,"timestamp":...,"url":...}``, compact, that key order)
in files named like allenai/c4's, gzip-compressed with a fixed header, so that the same recipe,
parameters and system texts give byte-identical files. Urls are synthetic but derived from the source
(``https://docs.python.org/3/library/json.html#para-3``) and timestamps fall in C4's April 2019 crawl.

Python's texts (pydoc's topics, docstrings of a fixed list of modules) are read by a fresh interpreter
that sees the standard library only, so what the calling process imported cannot change them. Which
system texts were found is recorded in ``CORPUS.json`` together with the sha256 of every file:
a machine with another Python or another Debian release makes a different (still deterministic)
corpus, and the manifest says why.

``ensure_builtin_corpus``, ``ensure_builtin_vocabulary`` and ``ensure_builtin_tokenizer`` build once into the
user's cache folder and reuse the result. A build goes into a temporary folder that is renamed into place
(``CORPUS.json`` written last), so no process ever sees a partial corpus; a file lock makes racing processes
wait for one build instead of repeating it, and the rename keeps them correct where locks do not work.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import numpy as np

from taskdata import fs
from taskdata.config import default_home
from taskdata.seeding import check_seed, derive_seed, example_rng

__all__ = [
    "CORPUS_MANIFEST",
    "DEFAULT_PARAMETERS",
    "DEFAULT_VOCAB_SIZE",
    "RECIPE_VERSION",
    "CorpusParameters",
    "build_corpus",
    "builtin_corpus_dir",
    "ensure_builtin_corpus",
    "ensure_builtin_tokenizer",
    "ensure_builtin_vocabulary",
    "read_manifest",
]

RECIPE_VERSION = 1
CORPUS_MANIFEST = "CORPUS.json"
DEFAULT_VOCAB_SIZE = 8_000

# Standard-library modules whose docstrings are English prose. Fixed and sorted so that the recipe
# does not depend on what else is installed; modules that a Python build lacks are recorded as missing.
# Modules with import side effects (antigravity, this, turtle needing a display) are left out.
# Written as words: the formatter would put a list literal one name per line.
_STDLIB_MODULES_WORDS = """
abc argparse array ast asyncio atexit base64 bdb binascii bisect builtins bz2 calendar cmath cmd code codecs
codeop collections collections.abc colorsys compileall concurrent.futures configparser contextlib
contextvars copy copyreg csv ctypes dataclasses datetime decimal difflib dis doctest email email.charset
email.generator email.header email.headerregistry email.message email.parser email.policy email.utils enum
errno faulthandler filecmp fileinput fnmatch fractions ftplib functools gc getopt getpass gettext glob
graphlib grp gzip hashlib heapq hmac html html.parser http.client http.cookiejar http.cookies http.server
imaplib importlib importlib.abc importlib.machinery importlib.metadata importlib.resources importlib.util
inspect io ipaddress itertools json keyword linecache locale logging logging.config logging.handlers lzma
mailbox math mimetypes mmap modulefinder multiprocessing netrc numbers opcode operator optparse os pathlib
pdb pkgutil platform plistlib poplib posix posixpath pprint profile pstats pwd py_compile pyclbr pydoc queue
quopri random re reprlib resource rlcompleter runpy sched secrets select selectors shelve shlex shutil
signal site smtplib socket socketserver sqlite3 ssl stat statistics string stringprep struct subprocess
symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit tokenize trace traceback
tracemalloc tty types typing unicodedata unittest unittest.mock urllib.error urllib.parse urllib.request
urllib.response urllib.robotparser uuid warnings wave weakref webbrowser wsgiref.handlers wsgiref.headers
wsgiref.simple_server wsgiref.util wsgiref.validate xml.dom.minidom xml.dom.pulldom xml.etree.ElementTree
xml.sax xml.sax.handler xml.sax.saxutils xml.sax.xmlreader zipapp zipfile zipimport zlib zoneinfo
"""
STDLIB_MODULES: tuple[str, ...] = tuple(_STDLIB_MODULES_WORDS.split())

LICENSES_DIR = "/usr/share/common-licenses"
_COMMON_LICENSES_WORDS = """
Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.2 GFDL-1.3 GPL-1 GPL-2 GPL-3 LGPL-2 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0
"""
COMMON_LICENSES: tuple[str, ...] = tuple(_COMMON_LICENSES_WORDS.split())

# Text files in Python's own standard-library folder (idlelib ships with every CPython build).
PYTHON_TEXT_FILES = (
    "LICENSE.txt",
    "idlelib/CREDITS.txt",
    "idlelib/HISTORY.txt",
    "idlelib/NEWS.txt",
    "idlelib/README.txt",
    "idlelib/TODO.txt",
)

DEBIAN_DOC_DIR = "/usr/share/doc"
# Packages of every Debian base system (also in python:3.11-slim), not whatever this machine has.
_DEBIAN_PACKAGES_WORDS = """
apt base-files bash bzip2 coreutils debianutils diffutils dpkg findutils gpgv grep gzip hostname libc6 login
mawk ncurses-base netbase perl-base sed tar tzdata util-linux xz-utils zlib1g
"""
DEBIAN_PACKAGES: tuple[str, ...] = tuple(_DEBIAN_PACKAGES_WORDS.split())

# C4's line rules (T5 paper, section 2.2): terminal punctuation, at least 5 words, no curly brackets.
_END_MARKS = (".", "?", "!", '"')
_MIN_WORDS = 5
_MIN_LETTER_FRACTION = 0.75  # ours: drops code and tables that C4 would have lost in HTML extraction
_DEP5_FIELD = re.compile(r"^[A-Z][A-Za-z-]*:")
_DEP5_EMPTY_LINE = re.compile(r"(?m)^[ \t]+\.[ \t]*$")
_BLANK_LINES = re.compile(r"\n[ \t]*\n")
# A sentence ends at terminal punctuation followed by a space and a capital (or an opening quote).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")

# Document lengths: log-normal targets whose realised mean (a document ends with the sentence that
# reaches its target) is C4 en's ~2,200 characters; calibrated empirically on the default build.
_LENGTH_MEDIAN = 1_280.0
_LENGTH_SIGMA = 1.0
_MIN_LENGTH, _MAX_LENGTH = 200, 50_000
_KEEP_PARAGRAPH = 0.85  # chance that a paragraph of the window is kept: varies windows that overlap
_VALIDATION_SHARE = 0.05
_MAX_DRAWS = 64
# CommonCrawl's April 2019 crawl (CC-MAIN-2019-18), where C4 en's timestamps fall.
_CRAWL_START = datetime.datetime(2019, 4, 18, tzinfo=datetime.UTC)
_CRAWL_SECONDS = 9 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class CorpusParameters:
    """How many documents and files each split gets, and the seed that picks them."""

    num_train_docs: int = 24_000
    num_validation_docs: int = 1_200
    train_files: int = 8
    validation_files: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for docs, files, split in (
            (self.num_train_docs, self.train_files, "train"),
            (self.num_validation_docs, self.validation_files, "validation"),
        ):
            for label, value in ((f"num_{split}_docs", docs), (f"{split}_files", files)):
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ValueError(
                        f"Corpus parameter {label} must be a positive integer but got {value!r}."
                    )
            if files > docs or files > 99_999:
                raise ValueError(
                    f"Corpus parameter {split}_files={files} must be at most num_{split}_docs={docs} "
                    "(no empty files) and at most 99999 (5-digit file numbers, as in C4)."
                )
        check_seed(self.seed)

    def docs_and_files(self, split: str) -> tuple[int, int]:
        if split == "train":
            return self.num_train_docs, self.train_files
        if split == "validation":
            return self.num_validation_docs, self.validation_files
        raise ValueError(f"The built-in corpus has splits 'train' and 'validation', not {split!r}.")

    @property
    def folder_name(self) -> str:
        """Names the recipe version and every parameter, so that each combination has its own folder."""
        return (
            f"c4-builtin-v{RECIPE_VERSION}-train{self.num_train_docs}x{self.train_files}"
            f"-validation{self.num_validation_docs}x{self.validation_files}-seed{self.seed}"
        )


DEFAULT_PARAMETERS = CorpusParameters()
_SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class _Unit:
    """One source page (a pydoc topic, a module's docstrings, a license): its url and paragraphs."""

    url: str
    paragraphs: tuple[str, ...]


# ---------------------------------------------------------------- gathering the system texts


def _paragraphs(text: str, *, dep5: bool = False) -> list[str]:
    """Blank-line separated blocks, whitespace collapsed, kept only if they pass C4's line rules."""
    text = text.replace("\r\n", "\n")
    if dep5:
        # Debian copyright files (DEP-5): " ." is an empty line; "Field:" lines are metadata.
        text = _DEP5_EMPTY_LINE.sub("", text)
        text = "\n".join(line for line in text.split("\n") if not _DEP5_FIELD.match(line))
    kept = []
    for block in _BLANK_LINES.split(text):
        paragraph = " ".join(block.split())
        if _is_prose(paragraph):
            kept.append(paragraph)
    return kept


def _is_prose(paragraph: str) -> bool:
    if not paragraph.endswith(_END_MARKS) or len(paragraph.split()) < _MIN_WORDS:
        return False
    if "{" in paragraph or "}" in paragraph or ">>>" in paragraph or "lorem ipsum" in paragraph.lower():
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return letters >= _MIN_LETTER_FRACTION * len(paragraph)


# Python's own texts are read in a fresh interpreter that can import the standard library only (-I -S:
# no site-packages, no .pth hooks, no PYTHON* variables), so nothing the caller imported can change
# them: importing TensorFlow first rewrites a collections.abc docstring (measured). Deprecated names
# (typing.io) warn when touched; warnings are ignored so that "-W error" cannot drop their text.
# A module's text is its docstring, then those of its public classes, functions and methods in name
# order, counting only objects whose __module__ is the module or one of its submodules (packages
# define their classes in submodules such as asyncio.events; re-exports are described where they live).
_PYTHON_TEXTS_SCRIPT = r"""
import importlib, inspect, json, sys, warnings

import pydoc_data.topics


def doc_of(obj):
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not (inspect.isroutine(obj) or isinstance(obj, (type, property))):
        return ""
    doc = getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) else ""


def docstrings(module):
    yield module.__doc__ or ""
    for name, obj in sorted(vars(module).items()):
        home = getattr(obj, "__module__", None)
        if name.startswith("_") or not isinstance(home, str):
            continue
        if home != module.__name__ and not home.startswith(module.__name__ + "."):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        yield doc_of(obj)
        if inspect.isclass(obj):
            for member_name, member in sorted(vars(obj).items()):
                if not member_name.startswith("_"):
                    yield doc_of(member)


warnings.simplefilter("ignore")
modules, missing = {}, []
for name in json.load(sys.stdin):
    try:
        module = importlib.import_module(name)
    except ImportError:
        missing.append(name)
        continue
    modules[name] = "\n\n".join(inspect.cleandoc(doc) for doc in docstrings(module) if doc)
json.dump(
    {"python": sys.version.split()[0], "topics": pydoc_data.topics.topics, "modules": modules,
     "missing": missing},
    sys.stdout,
)
"""


def _python_texts() -> dict[str, Any]:
    """pydoc's topics and the docstrings of STDLIB_MODULES, read by an isolated interpreter."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _PYTHON_TEXTS_SCRIPT],
        input=json.dumps(STDLIB_MODULES).encode("ascii"),
        capture_output=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"Reading Python's documentation with {sys.executable} -I -S failed (exit {result.returncode}): "
            f"{result.stderr.decode('utf-8', 'replace')[-2000:]}"
        )
    return json.loads(result.stdout.decode("ascii"))


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_sources() -> list[tuple[str, str, bool]]:
    """(path, url, is Debian copyright) of every text file the recipe reads, in recipe order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    files = [
        (os.path.join(stdlib, name), f"https://github.com/python/cpython/blob/{version}/Lib/{name}", False)
        for name in PYTHON_TEXT_FILES
    ]
    files += [
        (os.path.join(LICENSES_DIR, n), f"https://spdx.org/licenses/{n}.html", False) for n in COMMON_LICENSES
    ]
    files += [
        (os.path.join(DEBIAN_DOC_DIR, p, "copyright"), f"https://packages.debian.org/{p}", True)
        for p in DEBIAN_PACKAGES
    ]
    return files


def _gather() -> tuple[list[_Unit], dict[str, Any]]:
    """Every source unit in recipe order, and what was found on this machine (with content hashes)."""
    python = _python_texts()
    units: list[_Unit] = []
    topics = python["topics"]
    for key in sorted(topics):
        units.append(
            _Unit(f"https://docs.python.org/3/reference/{key}.html", tuple(_paragraphs(topics[key])))
        )
    docstrings_hash = hashlib.sha256()
    for name in STDLIB_MODULES:
        if name in python["modules"]:
            text = python["modules"][name]
            docstrings_hash.update(text.encode("utf-8"))
            units.append(_Unit(f"https://docs.python.org/3/library/{name}.html", tuple(_paragraphs(text))))

    files_found, files_missing = {}, []
    for path, url, dep5 in _file_sources():
        text = _read_text(path)
        if text is None:
            files_missing.append(path)
            continue
        files_found[path] = _sha256_text(text)
        units.append(_Unit(url, tuple(_paragraphs(text, dep5=dep5))))

    found = {
        "python": python["python"],
        "pydoc_topics": {"count": len(topics), "sha256": _sha256_text(repr(sorted(topics.items())))},
        "stdlib_docstrings": {
            "modules": len(python["modules"]),
            "missing": python["missing"],
            "sha256": docstrings_hash.hexdigest(),
        },
        "files": files_found,
        "files_missing": files_missing,
    }
    return units, found


@dataclasses.dataclass(frozen=True)
class _Pool:
    """A split's paragraphs in recipe order, as sentences, each with the url of its unit and place in it."""

    paragraphs: tuple[tuple[str, ...], ...]
    urls: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.paragraphs) < 2:
            raise ValueError(
                f"The built-in corpus found only {len(self.paragraphs)} usable paragraphs for a split; "
                "this Python/Debian installation lacks the texts the recipe uses (see CORPUS.json "
                "'sources'). Pass a C4 folder with --c4-dir or $TASKDATA_C4_DIR instead."
            )
        if len(self.urls) != len(self.paragraphs):
            raise ValueError(
                f"A pool needs one url per paragraph: {len(self.urls)} != {len(self.paragraphs)}."
            )


@lru_cache(maxsize=1)
def _pools() -> tuple[dict[str, _Pool], dict[str, Any]]:
    """Train and validation pools: whole units are held out for validation, as C4's pages are disjoint.

    Paragraphs that occur more than once (the same license text in many files) are kept only at their
    first occurrence, so no paragraph is in both pools.
    """
    units, found = _gather()
    seen: set[str] = set()
    deduplicated = []
    for unit in units:
        fresh = []
        for index, paragraph in enumerate(unit.paragraphs):
            if paragraph not in seen:
                seen.add(paragraph)
                fresh.append((paragraph, f"{unit.url}#para-{index}"))
        if fresh:
            deduplicated.append((unit.url, fresh))
    # Hold out units in an order fixed by a hash of their url until 5% of the characters are held out.
    total = sum(len(p) for _, fresh in deduplicated for p, _ in fresh)
    held_out: set[str] = set()
    held_chars = 0
    for url, fresh in sorted(deduplicated, key=lambda item: derive_seed(0, "builtin_c4_holdout", item[0])):
        if held_chars >= _VALIDATION_SHARE * total:
            break
        held_out.add(url)
        held_chars += sum(len(p) for p, _ in fresh)
    pools = {}
    for split in _SPLITS:
        entries = [
            e for url, fresh in deduplicated if (url in held_out) == (split == "validation") for e in fresh
        ]
        pools[split] = _Pool(
            tuple(tuple(_SENTENCE_END.split(p)) for p, _ in entries), tuple(u for _, u in entries)
        )
        found.setdefault("paragraphs", {})[split] = len(entries)
        found.setdefault("characters", {})[split] = sum(len(p) for p, _ in entries)
    return pools, found


# ---------------------------------------------------------------- documents and files


def _document(pool: _Pool, rng: np.random.Generator) -> tuple[str, str]:
    """(text, url): consecutive sentences from a random sentence on, up to a log-normal length.

    Lines are the pool's paragraphs (some skipped); the first may start and the last may end at any
    sentence, as web page extracts do. Starting and ending between sentences multiplies the number of
    distinct documents a small pool can give, and every line still ends with terminal punctuation.
    """
    target = float(np.clip(rng.lognormal(np.log(_LENGTH_MEDIAN), _LENGTH_SIGMA), _MIN_LENGTH, _MAX_LENGTH))
    n = len(pool.paragraphs)
    start = int(rng.integers(n))
    first = pool.paragraphs[start]
    line = list(first[int(rng.integers(len(first))) :])
    lines = []
    length = -1  # no newline before the first line
    position = start
    # Bounded by one pass over the pool: a target longer than the pool ends the document early.
    for _ in range(n):
        lines.append(line)
        length += 1
        for count, sentence in enumerate(line, start=1):
            length += len(sentence) + (count > 1)
            if length >= target:
                del line[count:]
                return "\n".join(" ".join(sentences) for sentences in lines), pool.urls[start]
        line = []
        while not line:
            position = (position + 1) % n
            if rng.random() < _KEEP_PARAGRAPH:
                line = list(pool.paragraphs[position])
    return "\n".join(" ".join(sentences) for sentences in lines), pool.urls[start]


def _timestamp(rng: np.random.Generator) -> str:
    moment = _CRAWL_START + datetime.timedelta(seconds=int(rng.integers(_CRAWL_SECONDS)))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _documents(pool: _Pool, split: str, count: int, seed: int) -> Iterator[dict[str, str]]:
    """``count`` distinct documents; document i draws from its own RNG keyed by (seed, split, i)."""
    seen: set[bytes] = set()
    for index in range(count):
        rng = example_rng(seed, "taskdata.builtin_c4", split, index)
        for _ in range(_MAX_DRAWS):
            text, url = _document(pool, rng)
            digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
            if digest not in seen:
                break
        else:
            raise ValueError(
                f"The built-in corpus cannot make {count} distinct {split} documents from its "
                f"{len(pool.paragraphs)} paragraphs (document {index} repeated {_MAX_DRAWS} times). "
                "Ask for fewer documents or pass a real C4 folder."
            )
        seen.add(digest)
        yield {"text": text, "timestamp": _timestamp(rng), "url": url}


def _file_name(split: str, index: int, count: int) -> str:
    return f"c4-{split}.{index:05d}-of-{count:05d}.json.gz"


Log = Callable[[str], None]


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _write_split(folder: str, pool: _Pool, split: str, params: CorpusParameters, log: Log) -> dict[str, Any]:
    num_docs, num_files = params.docs_and_files(split)
    started, written = time.monotonic(), 0
    documents = _documents(pool, split, num_docs, params.seed)
    files, chars = [], 0
    for file_index in range(num_files):
        # Contiguous runs of documents, as even as integer division allows.
        size = (file_index + 1) * num_docs // num_files - file_index * num_docs // num_files
        name = _file_name(split, file_index, num_files)
        path = os.path.join(folder, name)
        # mtime=0 and no file name in the header: the bytes depend on the content alone. Level 4 is
        # 5% larger than level 6 in less than half the time (measured on this corpus).
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=4) as gz,
        ):
            for _ in range(size):
                document = next(documents)
                chars += len(document["text"])
                gz.write(json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
                gz.write(b"\n")
        files.append(
            {"name": name, "documents": size, "bytes": os.path.getsize(path), "sha256": _sha256(path)}
        )
        written += size
        seconds = time.monotonic() - started
        log(f"[corpus] {split}: file {file_index + 1}/{num_files}, {written:,}/{num_docs:,} documents "
            f"({written / max(seconds, 1e-9):,.0f}/s, ETA {seconds * (num_docs - written) / written:.0f} s)")
    return {"documents": num_docs, "characters": chars, "files": files}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _build_into(folder: str, params: CorpusParameters, log: Log = _to_stderr) -> dict[str, Any]:
    """Writes every file of the corpus into the existing empty ``folder``, ``CORPUS.json`` last."""
    log("[corpus] gathering English text from Python's documentation and Debian's copyright files")
    pools, found = _pools()
    manifest: dict[str, Any] = {
        "format": "allenai/c4 en json-lines (taskdata built-in corpus)",
        "recipe_version": RECIPE_VERSION,
        "parameters": dataclasses.asdict(params),
        "sources": found,
        "zlib": zlib.ZLIB_VERSION,
        "splits": {split: _write_split(folder, pools[split], split, params, log) for split in _SPLITS},
    }
    data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    with open(os.path.join(folder, CORPUS_MANIFEST), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def _check_local(path: str) -> str:
    if fs.is_remote(path):
        raise ValueError(
            f"The built-in corpus is written to local folders only, not {path!r}: build it locally, "
            "then copy the folder (e.g. with 'gsutil -m cp -r')."
        )
    return os.path.abspath(path.removeprefix("file://"))


def _publish_folder(out_dir: str, params: CorpusParameters) -> bool:
    """Builds into a temporary sibling of ``out_dir`` and renames it into place.

    Returns False, leaving the existing folder alone, if ``out_dir`` appeared meanwhile (another
    process won the race).
    """
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{uuid.uuid4().hex}")
    os.mkdir(tmp)
    try:
        _build_into(tmp, params)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if os.path.isdir(out_dir):
                return False
            raise
        return True
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)


def build_corpus(
    out_dir: str,
    num_train_docs: int = DEFAULT_PARAMETERS.num_train_docs,
    num_validation_docs: int = DEFAULT_PARAMETERS.num_validation_docs,
    train_files: int = DEFAULT_PARAMETERS.train_files,
    validation_files: int = DEFAULT_PARAMETERS.validation_files,
    seed: int = DEFAULT_PARAMETERS.seed,
) -> dict[str, Any]:
    """Writes the built-in corpus to the new local folder ``out_dir`` and returns its manifest."""
    params = CorpusParameters(num_train_docs, num_validation_docs, train_files, validation_files, seed)
    out_dir = _check_local(out_dir)
    if os.path.exists(out_dir):
        raise FileExistsError(
            f"Corpus folder {out_dir!r} already exists; build_corpus writes new folders only. "
            "Delete it or pick another path."
        )
    if not _publish_folder(out_dir, params):
        raise FileExistsError(f"Corpus folder {out_dir!r} was created by another process during the build.")
    return read_manifest(out_dir)


def read_manifest(corpus_dir: str) -> dict[str, Any]:
    """The ``CORPUS.json`` of a complete corpus folder."""
    path = os.path.join(corpus_dir, CORPUS_MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{corpus_dir!r} is not a complete built-in corpus: it has no {CORPUS_MANIFEST} (the marker "
            "written last). Delete the folder; it is rebuilt on next use."
        ) from None


# ---------------------------------------------------------------- the user's cached copies


def builtin_corpus_dir(params: CorpusParameters = DEFAULT_PARAMETERS, home: str | None = None) -> str:
    """Where ``ensure_builtin_corpus`` keeps the corpus for ``params`` under ``home`` (default
    ``taskdata.config.default_home()``); it may not exist yet."""
    return os.path.join(_check_local(home or default_home()), "corpus", params.folder_name)


@contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    """Holds an exclusive lock; the OS releases it if the process dies, so it never goes stale."""
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _ensure(target: str, is_complete: Callable[[], bool], build: Callable[[], None]) -> str:
    if is_complete():
        return target
    parent, name = os.path.split(target)
    with _exclusive(os.path.join(parent, f".{name}.lock")):
        if not is_complete():
            build()
    return target


def ensure_builtin_corpus(params: CorpusParameters = DEFAULT_PARAMETERS, home: str | None = None) -> str:
    """The folder of the built-in corpus for ``params``, built on first use and reused afterwards."""
    out_dir = builtin_corpus_dir(params, home)

    def is_complete() -> bool:
        if os.path.isfile(os.path.join(out_dir, CORPUS_MANIFEST)):
            return True
        if os.path.exists(out_dir):
            read_manifest(out_dir)  # raises, naming the incomplete folder and the fix
        return False

    def build() -> None:
        started = time.monotonic()
        _to_stderr(f"[corpus] building the built-in C4-format corpus into {out_dir} (once per home folder)")
        _publish_folder(out_dir, params)
        documents = params.num_train_docs + params.num_validation_docs
        _to_stderr(f"[corpus] built {documents:,} documents in {time.monotonic() - started:.1f} s")

    return _ensure(out_dir, is_complete, build)


def ensure_builtin_vocabulary(
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    params: CorpusParameters = DEFAULT_PARAMETERS,
    home: str | None = None,
) -> str:
    """A SentencePiece model (T5's conventions) trained on the built-in corpus's train split.

    Kept inside the corpus folder and trained once; racing processes use the first one published.
    """
    from taskdata.define.vocab_training import SentencePieceOptions, train_from_source
    from taskdata.sources.c4 import C4Source

    corpus_dir = ensure_builtin_corpus(params, home)
    path = os.path.join(corpus_dir, f"sentencepiece-{SentencePieceOptions(vocab_size).file_tag}.model")

    def build() -> None:
        started = time.monotonic()
        _to_stderr(f"[vocab] training the built-in SentencePiece vocabulary ({vocab_size:,} pieces) on the corpus's "
                   "train split (once per home folder)")
        train_from_source(C4Source(corpus_dir, splits=("train",)), "train", vocab_size, path)
        _to_stderr(f"[vocab] trained {path} in {time.monotonic() - started:.1f} s")

    return _ensure(path, lambda: os.path.isfile(path), build)


def ensure_builtin_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    params: CorpusParameters = DEFAULT_PARAMETERS,
    home: str | None = None,
) -> str:
    """A byte-level BPE ``tokenizer.json`` (Hugging Face ``tokenizers``, T5's special ids) trained on the
    built-in corpus's train split, for the built-in decoder-only task.

    Kept inside the corpus folder and trained once; racing processes use the first one published.
    """
    from taskdata.define.bpe_training import BpeOptions, train_bpe_from_source
    from taskdata.sources.c4 import C4Source

    corpus_dir = ensure_builtin_corpus(params, home)
    path = os.path.join(corpus_dir, f"tokenizer-{BpeOptions(vocab_size).file_tag}.json")

    def build() -> None:
        started = time.monotonic()
        _to_stderr(f"[vocab] training the built-in BPE tokenizer ({vocab_size:,} tokens) on the corpus's train split "
                   "(once per home folder)")
        train_bpe_from_source(C4Source(corpus_dir, splits=("train",)), "train", vocab_size, path)
        _to_stderr(f"[vocab] trained {path} in {time.monotonic() - started:.1f} s")

    return _ensure(path, lambda: os.path.isfile(path), build)
