"""The examples not covered by the other tests, run as users run them."""


def test_checkpoint_example(example, tmp_path):
    out = example("checkpoint.py", str(tmp_path))
    assert "inspect: ['w'] changed" in out
    assert "result equals NEW byte for byte" in out
    assert "wrong base refused" in out


def test_readme_quick_start(example):
    assert "readme ok" in example("quick_start.py")
