"""Packaging for aogpt.

The source folders sit at the top of the repository (model/, trainer/, data_prep/) so that
`deepspeed trainer/main.py` and `python data_prep/owt_to_mds.py` run from a checkout, but they
install under the `aogpt` namespace: bare `model`/`trainer` names in site-packages would
collide with other projects.
"""

from setuptools import setup

PACKAGES = {"aogpt": "aogpt", "aogpt.model": "model", "aogpt.model.hf": "model/hf",
            "aogpt.model.sampler": "model/sampler",
            "aogpt.trainer": "trainer", "aogpt.trainer.replay": "trainer/replay",
            "aogpt.data_prep": "data_prep",
            # libraries whose command is their __main__.py (python -m aogpt.data_prep.X)
            "aogpt.data_prep.tokenizer": "data_prep/tokenizer",
            "aogpt.data_prep.shared_memory": "data_prep/shared_memory",
            "aogpt.data_prep.corpora": "data_prep/corpora"}

setup(
    name="aogpt",
    version="0.1.0",
    description="Distributed pretraining of AO-GPT, the any-order GPT / masked diffusion model",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    # the replay page's template, style and script, read at run time (aogpt.trainer.replay)
    package_data={"aogpt.trainer.replay": ["*.html", "*.css", "*.js"]},
    install_requires=[
        "torch>=2.4,<3",  # F.rms_norm
        "deepspeed>=0.19.8,<0.20",
        "mosaicml-streaming==0.13.0",
        "numpy>=1.24,<2.2",  # streaming's own bound
        "tiktoken>=0.7",
        "pyyaml>=6",
        "tqdm>=4.64",
        "wandb>=0.17",
        "matplotlib>=3.7",
        "datasets>=4",
        "pyarrow>=14",
        "orjson>=3.9",  # data prep's JSON lines
        "xxhash>=3,<4",
        "zstd>=1.5,<2",
        "transformers>=4.40,<5",  # the exported model (tools/export_hf.py), the judge (genppl.py)
    ],
    extras_require={
        # playwright: the browser tests drive the system's Chromium (.ci/run installs it)
        "test": ["pytest>=8", "pytest-xdist>=3.5", "ruff>=0.6", "playwright>=1.45,<2"],
        "gpu": ["flash-attn>=2.6"],
        "cloud": ["boto3>=1.21,<2"],
        # the lm-evaluation-harness model (aogpt.trainer.lm_harness); nothing else imports it.
        # accelerate: lm-eval's own `hf` model imports it (it runs tools/export_hf.py's folders)
        "lm-eval": ["lm-eval>=0.4.13,<0.5", "accelerate>=0.26"],
    },
)
