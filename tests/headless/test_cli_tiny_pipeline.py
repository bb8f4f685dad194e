"""``steadfast tiny-pipeline DIR``: the folder the loader's error message tells a new user to write."""

from __future__ import annotations

from pathlib import Path

from steadfast.core.pipelines import load_pipeline
from steadfast.headless.verify_cli import main


def test_tiny_pipeline_writes_a_loadable_folder_once(tmp_path: Path, capsys) -> None:
    out = tmp_path / "models" / "diffusers" / "steadfast-tiny-sd"
    assert main(["tiny-pipeline", str(out)]) == 0
    assert (out / "model_index.json").is_file() and (out / "unet").is_dir()
    assert type(load_pipeline(out)).__name__ == "StableDiffusionPipeline"
    assert main(["tiny-pipeline", str(out)]) == 2  # never overwrites
    assert "not empty" in capsys.readouterr().err
