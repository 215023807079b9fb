"""The GitHub workflows run what the README tells a new user to run, and publish on a version tag."""

from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def _load(name):
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    return data.get("on", data.get(True)), data["jobs"]      # YAML 1.1 reads the key `on` as True


def _runs(jobs):
    return [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]


def test_ci_runs_the_readme_test_command_on_push_and_pull_request():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make test" in readme
    triggers, jobs = _load("ci.yml")
    assert set(triggers) == {"push", "pull_request"}
    assert "make test" in _runs(jobs)


def test_release_builds_and_uploads_on_version_tags_with_the_token():
    triggers, jobs = _load("release.yml")
    assert triggers == {"push": {"tags": ["v*"]}}
    steps = [step for job in jobs.values() for step in job["steps"]]
    upload = next(step for step in steps if "make upload" in step.get("run", ""))
    assert upload["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    assert steps.index(upload) > steps.index(next(s for s in steps if s.get("run") == "make test"))
