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
before anything is deleted.
"""

import json
import os
import shutil
from pathlib import Path
from typing import NoReturn

from aogpt import UsageError
from aogpt.data_prep import mds
from aogpt.data_prep.manifest import FILENAME, FORMAT, write_manifest

PARTIAL = ".partial"
SETTINGS = "settings.json"
INDEX = "index.json"
SLICES = ".slices"  # the slices of a build across many tasks (data_prep/slices.py)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class OutputDir:
    """DIR and its DIR/.partial; `splits` names DIR's MDS folders ("train", "val"; "." for an
    eval set, whose one split is DIR itself)."""

    def __init__(self, root: str | Path, splits: tuple[str, ...]):
        self.root = Path(root)
        self.partial = self.root / PARTIAL
        self.work = self.partial / "work"  # scratch files, deleted when published
        self.out = self.partial / "out"  # what publish() moves into DIR
        self.splits = splits
        self.built = False  # a local build always builds (a remote --out may have it staged)
        self._created_root = False

    def start(self, settings: dict, overwrite: bool) -> bool:
        """Makes .partial ready for a build with `settings`; False when DIR holds that build.

        `settings` is everything the output depends on (inputs, options, tool version).
        """
        settings = json.loads(json.dumps(settings))  # the form it has when read back
        entries = self._entries()
        if FILENAME in entries and PARTIAL in entries:  # a crash in publishing's very last step
            shutil.rmtree(self.partial)
            entries.remove(PARTIAL)
        has_manifest, has_partial = FILENAME in entries, PARTIAL in entries
        ours = [name for name in entries if name not in (FILENAME, PARTIAL, SLICES)]
        if has_partial and not overwrite and self._saved_settings() == settings:
            if (self.partial / FILENAME).is_file():
                print(f"finishing the interrupted publishing of {self.root}", flush=True)
                self._publish()
                return False
            print(f"resuming the interrupted build in {self.partial}", flush=True)
            return True
        if has_manifest and not has_partial and not overwrite:
            if json.loads((self.root / FILENAME).read_text()).get("settings") != settings:
                raise UsageError(f"{self.root} holds a finished dataset built with other "
                                 f"settings or inputs: pass --overwrite to rebuild it, or choose "
                                 f"another folder")
            return False
        if has_partial:
            print(f"starting over: {self.partial} was made by a run with other settings"
                  if not overwrite else f"--overwrite: removing {self.partial}", flush=True)
        elif ours and not has_manifest and not overwrite:
            raise UsageError(
                f"output folder {self.root} holds {ours[0]!r} but no {FILENAME} (an unfinished "
                f"build of another tool or version?): pass --overwrite to rebuild it there"
            )
        self._clear()
        self.work.mkdir(parents=True)
        self.out.mkdir()
        (self.partial / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
        return True

    def publish(self, manifest: dict) -> dict:
        """Moves the finished datasets into DIR and writes DIR/manifest.json last; returns it.

        The manifest keeps the build's settings, so that a later run can tell "already done"
        from "asked for something else".
        """
        manifest = {**manifest, "settings": self._saved_settings()}
        write_manifest(self.partial / FILENAME, manifest)
        self._publish()
        return manifest

    def finished_manifest(self) -> dict:
        return json.loads((self.root / FILENAME).read_text())

    @property
    def staging_root(self) -> Path:
        """Where the build happens: DIR itself."""
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
        slices it was merged from, and DIR when nothing else is left in it."""
        self._entries()  # refuses a DIR that holds anything else
        self._clear()
        shutil.rmtree(self.root / SLICES, ignore_errors=True)
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
        tool's (DIR is created if missing)."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"output {self.root} is a file, not a folder: choose a folder path")
        if not self.root.exists():
            self.root.mkdir(parents=True)
            self._created_root = True
        entries = sorted(os.listdir(self.root))
        if FILENAME in entries and not self._is_our_manifest(self.root / FILENAME):
            raise UsageError(f"output folder {self.root} holds a {FILENAME} that is not an aogpt "
                             f"data manifest: choose an empty or new folder")
        ours = {FILENAME, PARTIAL, SLICES, *self.splits}
        for split in self.splits:
            if split == ".":
                ours |= self._written(self.root)
            elif split in entries:
                self._check_mds_folder(split)
        foreign = [name for name in entries if name not in ours]
        if foreign:
            self._refuse(foreign[0], "which this tool did not write")
        return entries

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

    def _clear(self) -> None:
        """Deletes what _entries found to be this tool's: the manifest first (DIR stops claiming
        to be complete), each index after its shards (what is left stays listed), .partial last."""
        (self.root / FILENAME).unlink(missing_ok=True)
        for split in self.splits:
            folder = self.root / split
            if folder.is_dir():
                for name in sorted(self._written(folder), key=lambda name: name == INDEX):
                    (folder / name).unlink(missing_ok=True)
                if split != ".":
                    folder.rmdir()
        if self.partial.exists():
            shutil.rmtree(self.partial)

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
