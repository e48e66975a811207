"""An output folder's life: build in DIR/.partial, publish into DIR with manifest.json last.

A run never leaves a mixed or duplicated dataset behind:
- everything is written under DIR/.partial/ (work files in work/, the finished MDS in out/);
- publishing writes .partial/manifest.json, moves each entry of out/ into DIR, copies the
  manifest to DIR/manifest.json and deletes .partial. A manifest in DIR therefore means
  "complete", and a crash while publishing is finished by the next run;
- a re-run finds nothing (build), a manifest (complete: nothing to do unless --overwrite), or
  .partial: resumed when it was started with the same settings, else started over;
- bad input found mid-build (a UsageError) deletes .partial, since a re-run would fail the same way.
A run only ever deletes what this tool wrote: manifest.json, .partial, .slices (the slices a
merge was built from, once it is published), and in each MDS folder (train/ and val/, or an eval
set's DIR itself) index.json and the shard files it lists. Anything else there is refused,
before anything is deleted. "This tool" is the builder (settings["tool"]: owt_to_mds,
eval_to_mds, synthetic_to_mds, sudoku_to_mds): a dataset, or an unfinished build, that another
builder made is refused even with --overwrite, and so is an MDS folder without a manifest (its
builder is unknown); the refusal names the builder and says to choose another folder.

A remote --out is built in a staging folder (StagingDir): one the tool made, or an empty one it
was given, marked as the tool's own (.aogpt-staging.json, with the URL it stages) before anything
else is written there. A folder that holds anything else, a finished dataset above all, is
refused: it is never taken for a staged build, uploaded or deleted.
"""

import json
import os
import shutil
from pathlib import Path
from typing import NoReturn

from aogpt import UsageError
from aogpt.data_prep import mds
from aogpt.data_prep.manifest import (
    FILENAME,
    FORMAT,
    builder_of,
    describe_builder,
    write_manifest,
)
from aogpt.files import write_text_atomic

PARTIAL = ".partial"
SETTINGS = "settings.json"
INDEX = "index.json"
SLICES = ".slices"  # the slices of a build across many tasks (data_prep/slices.py)


def join_split(split: str) -> str:
    """How a message names an MDS folder: "train/", or an eval set's index.json in DIR."""
    return INDEX if split == "." else f"{split}/"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class OutputDir:
    """DIR and its DIR/.partial; `splits` names DIR's MDS folders ("train", "val"; "." for an
    eval set, whose one split is DIR itself)."""

    OWN = (FILENAME, PARTIAL, SLICES)  # DIR's entries that are this tool's besides the splits

    def __init__(self, root: str | Path, splits: tuple[str, ...]):
        self.root = Path(root)
        self.partial = self.root / PARTIAL
        self.work = self.partial / "work"  # scratch files, deleted when published
        self.out = self.partial / "out"  # what publish() moves into DIR
        self.splits = splits
        self.built = False  # a local build always builds (a remote --out may have it staged)
        self.builder: str | None = None  # settings["tool"], from start()
        self._created_root = False

    def start(self, settings: dict, overwrite: bool) -> bool:
        """Makes .partial ready for a build with `settings`; False when DIR holds that build.

        `settings` is everything the output depends on (inputs, options, settings["tool"]: the
        builder, and its version).
        """
        settings = json.loads(json.dumps(settings))  # the form it has when read back
        self.builder = settings["tool"]
        entries = self._entries()
        if FILENAME in entries and PARTIAL in entries and self._published():
            shutil.rmtree(self.partial)  # a crash in publishing's very last step
            entries.remove(PARTIAL)
        has_manifest, has_partial = FILENAME in entries, PARTIAL in entries
        if has_partial and not overwrite and self._saved_settings() == settings:
            if (self.partial / FILENAME).is_file():
                print(f"finishing the interrupted publishing of {self.root}", flush=True)
                self._publish()
                return False
            print(f"resuming the interrupted build in {self.partial}", flush=True)
            self._clear_dataset()  # an earlier dataset that this build replaces
            return True
        if has_manifest and not has_partial and not overwrite:
            if self.finished_manifest().get("settings") != settings:
                raise UsageError(f"{self.root} holds a finished dataset built with other "
                                 f"settings or inputs: pass --overwrite to rebuild it, or choose "
                                 f"another folder")
            return False
        if has_partial:
            print(f"starting over: {self.partial} was made by a run with other settings"
                  if not overwrite else f"--overwrite: removing {self.partial}", flush=True)
            shutil.rmtree(self.partial)
        self.work.mkdir(parents=True)
        self.out.mkdir()
        write_text_atomic(self.partial / SETTINGS, json.dumps(settings, indent=2) + "\n")
        self._clear_dataset()  # after .partial names this build: a crash here resumes it
        return True

    def publish(self, manifest: dict) -> dict:
        """Moves the finished datasets into DIR and writes DIR/manifest.json last; returns it.

        The manifest keeps the build's settings, so that a later run can tell "already done"
        from "asked for something else", and its builder, which alone may replace it.
        """
        settings = self._saved_settings()
        manifest = {**manifest, "builder": settings["tool"], "settings": settings}
        write_manifest(self.partial / FILENAME, manifest)
        self._publish()
        return manifest

    def finished_manifest(self) -> dict:
        return json.loads((self.root / FILENAME).read_text())

    @property
    def staging_root(self) -> Path:
        """Where the build happens: DIR itself."""
        return self.root

    def slices_root(self) -> Path:
        """Where --slice writes its slice (in .slices): DIR itself."""
        return self.root

    def holds(self, settings: dict) -> bool:
        """Whether DIR holds the finished dataset of these settings."""
        return ((self.root / FILENAME).is_file() and self._is_our_manifest(self.root / FILENAME)
                and self.finished_manifest().get("settings") == json.loads(json.dumps(settings)))

    def discard(self) -> None:
        """Removes everything this run wrote (after bad input: no partial output is left)."""
        if self.partial.exists():
            shutil.rmtree(self.partial)
        if self._created_root and not any(self.root.iterdir()):
            self.root.rmdir()

    def remove(self) -> None:
        """Deletes the dataset this tool wrote in DIR (a staging copy, once uploaded) and the
        slices it was merged from, and DIR when nothing else is left in it and this tool made
        it. Anything else in DIR stays where it is."""
        self._clear_dataset()
        for own in (self.partial, self.root / SLICES):
            shutil.rmtree(own, ignore_errors=True)
        if not any(self.root.iterdir()):
            self.root.rmdir()

    def _publish(self) -> None:
        # index.json first: after a crash here, DIR's index lists every shard DIR holds.
        for entry in sorted(self.out.iterdir(), key=lambda path: (path.name != INDEX, path.name)):
            target = self.root / entry.name
            if target.exists():  # moved before a crash, or a stale leftover of that crash
                _remove(target)
            os.replace(entry, target)
        write_manifest(self.root / FILENAME, json.loads((self.partial / FILENAME).read_text()))
        shutil.rmtree(self.partial)

    def _entries(self) -> list[str]:
        """DIR's entries, after checking that everything in DIR and in its MDS folders is this
        builder's (DIR is created if missing)."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"output {self.root} is a file, not a folder: choose a folder path")
        if not self.root.exists():
            self.root.mkdir(parents=True)
            self._created_root = True
        entries = sorted(os.listdir(self.root))
        if FILENAME in entries and not self._is_our_manifest(self.root / FILENAME):
            raise UsageError(f"output folder {self.root} holds a {FILENAME} that is not an aogpt "
                             f"data manifest: choose an empty or new folder")
        if self.builder is not None:
            self._check_builder(entries)
        ours = {*self.OWN, *self.splits}
        for split in self.splits:
            if split == ".":
                ours |= self._written(self.root)
            elif split in entries:
                self._check_mds_folder(split)
        foreign = [name for name in entries if name not in ours]
        if foreign:
            self._refuse(foreign[0], "which this tool did not write")
        return entries

    def _check_builder(self, entries: list[str]) -> None:
        """Refuses what another builder made (a dataset, an unfinished build), and MDS folders
        whose builder no manifest names: never this builder's to replace, --overwrite or not."""
        this = describe_builder(self.builder)
        if FILENAME in entries:
            manifest = self.finished_manifest()
            theirs = builder_of(manifest)
            if theirs != self.builder:
                raise UsageError(
                    f"output folder {self.root} holds a dataset that {describe_builder(theirs)} "
                    f"built ({manifest.get('dataset')}), and {this} replaces only its own, even "
                    f"with --overwrite: choose another --out (nothing was deleted)")
        saved = self._saved_settings() if PARTIAL in entries else None
        if saved is not None and saved.get("tool") != self.builder:
            raise UsageError(
                f"output folder {self.root} holds an unfinished build of "
                f"{describe_builder(saved.get('tool'))} ({PARTIAL}), which {this} does not "
                f"replace: finish it with that command, or choose another --out (nothing was "
                f"deleted)")
        unnamed = [split for split in self.splits if self._written(self.root / split)]
        if unnamed and FILENAME not in entries and PARTIAL not in entries:
            raise UsageError(
                f"output folder {self.root} holds {join_split(unnamed[0])} but no {FILENAME}, "
                f"so which tool wrote it is unknown, and {this} does not replace it, even with "
                f"--overwrite: move it elsewhere or choose another --out (nothing was deleted)")

    def _check_mds_folder(self, split: str) -> None:
        folder = self.root / split
        if folder.is_symlink() or not folder.is_dir():
            self._refuse(split, "which this tool did not write")
        written = self._written(folder)
        for name in sorted(os.listdir(folder)):
            if name not in written:
                self._refuse(f"{split}/{name}", f"which {split}/{INDEX} does not list, so it is "
                                                f"not this tool's to delete")

    def _written(self, folder: Path) -> set[str]:
        """What this tool wrote in an MDS folder: index.json and the shard files it lists."""
        if not (folder / INDEX).exists():
            return set()
        try:
            entries = mds.read_index(folder)
            return {INDEX} | {entry[kind]["basename"] for entry in entries
                              for kind in ("raw_data", "zip_data") if entry.get(kind)}
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(
                f"output folder {self.root} holds {folder / INDEX}, which is not a readable MDS "
                f"index, so this tool cannot tell which files there it wrote: move {folder} "
                f"elsewhere or choose another --out (nothing was deleted)") from None

    def _refuse(self, name: str, why: str) -> NoReturn:
        raise UsageError(f"output folder {self.root} holds {name!r}, {why}: move it elsewhere or "
                         f"choose another --out (nothing was deleted)")

    def _clear_dataset(self) -> None:
        """Deletes the dataset _entries found to be this builder's: the manifest first (DIR stops
        claiming to be complete), each index after its shards (what is left stays listed)."""
        (self.root / FILENAME).unlink(missing_ok=True)
        for split in self.splits:
            folder = self.root / split
            if folder.is_dir():
                for name in sorted(self._written(folder), key=lambda name: name == INDEX):
                    (folder / name).unlink(missing_ok=True)
                if split != "." and not any(folder.iterdir()):
                    folder.rmdir()

    def _published(self) -> bool:
        """Whether .partial is what a publishing left after its last move: its manifest is DIR's."""
        try:
            return (self.partial / FILENAME).read_bytes() == (self.root / FILENAME).read_bytes()
        except OSError:
            return False

    def _saved_settings(self) -> dict | None:
        try:
            return json.loads((self.partial / SETTINGS).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    @staticmethod
    def _is_our_manifest(path: Path) -> bool:
        try:
            return json.loads(path.read_text()).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            return False


STAGING_MARK = ".aogpt-staging.json"


class StagingDir(OutputDir):
    """The local folder that a remote --out (`url`) is built in before its upload. It is the
    tool's own: a folder it made, or an empty one it was given, marked so (STAGING_MARK, with the
    URL) before anything else is written there; `default` is a folder of the tool's own namespace
    (one per URL under $TMPDIR), its own whatever it holds. After the upload only the staged
    files go, and the folder itself when the tool made it."""

    OWN = (*OutputDir.OWN, STAGING_MARK)

    def __init__(self, root: str | Path, splits: tuple[str, ...], url: str, default: bool):
        super().__init__(root, splits)
        self.url, self.default = url, default

    def check(self) -> None:
        """Refuses, writing nothing, a --staging folder that is neither new, nor empty, nor this
        URL's staging folder."""
        if self.default or not self.root.exists():
            return
        if not self.root.is_dir():
            raise UsageError(f"--staging {self.root} is a file, not a folder: give a new or "
                             f"empty folder")
        mark = self._mark()
        if mark is not None and mark.get("url") != self.url:
            raise UsageError(f"--staging {self.root} is the staging folder of an upload to "
                             f"{mark.get('url')}: finish that one with its command, or give "
                             f"another --staging (nothing was deleted)")
        entries = sorted(os.listdir(self.root))
        if mark is None and entries:
            raise UsageError(f"--staging {self.root} holds {self._describe(entries)}, and a "
                             f"staging folder is this tool's alone (the build is uploaded, then "
                             f"deleted): give a new or empty --staging (nothing was deleted)")

    def claim(self) -> None:
        """Makes the folder this tool's staging folder for `url` (checked first)."""
        self.check()
        created = self.default or not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        if self._mark() is None:
            write_text_atomic(self.root / STAGING_MARK, json.dumps(
                {"format": "aogpt-staging", "url": self.url, "created": created}) + "\n")

    def start(self, settings: dict, overwrite: bool) -> bool:
        self.claim()
        return super().start(settings, overwrite)

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)
        if not set(os.listdir(self.root)) - {STAGING_MARK}:  # slices stay this tool's
            self._release()

    def remove(self) -> None:
        self._clear_dataset()
        for own in (self.partial, self.root / SLICES):
            shutil.rmtree(own, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        """Unmarks the folder (its upload is done, or was never started), and deletes it when
        the tool made it and nothing else is there."""
        created = (self._mark() or {}).get("created")
        (self.root / STAGING_MARK).unlink(missing_ok=True)
        if created and not any(self.root.iterdir()):
            self.root.rmdir()

    def _mark(self) -> dict | None:
        try:
            mark = json.loads((self.root / STAGING_MARK).read_text())
        except (OSError, ValueError):
            return None
        return mark if isinstance(mark, dict) and mark.get("format") == "aogpt-staging" else None

    def _describe(self, entries: list[str]) -> str:
        """What a folder holds, as a refusal names it: a dataset, a build, or its first entry."""
        if FILENAME in entries and self._is_our_manifest(self.root / FILENAME):
            manifest = self.finished_manifest()
            return (f"a finished dataset ({manifest.get('dataset')}, built by "
                    f"{describe_builder(builder_of(manifest))})")
        if PARTIAL in entries:
            return f"an unfinished build ({PARTIAL})"
        return repr(entries[0])
