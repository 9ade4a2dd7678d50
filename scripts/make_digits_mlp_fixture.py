#!/usr/bin/env python3
"""Writes the NumPy reference fixture for models/digits_mlp.mgn (defaults: batch 64, hidden 128).

    pip install numpy safetensors
    python3 scripts/make_digits.py              # first, if data/ is missing
    python3 scripts/make_digits_mlp_fixture.py

The model: logits = fc2(relu(fc1(images))), loss = mean softmax cross-entropy, where
fc(x) = x @ weight.T + bias (PyTorch's nn.Linear). Everything is computed independently of
mgn, in float64 from the float32 values stored in the fixture, then stored as float32.

Output, in tests/fixtures/digits_mlp/:
    weights.safetensors   fc1.weight f32[128, 64], fc1.bias f32[128],
                          fc2.weight f32[10, 128], fc2.bias f32[10]
                          (seeded; PyTorch's default nn.Linear init, uniform(+-1/sqrt(fan_in)))
    inputs.safetensors    images f32[64, 64] (the first 64 training digits), labels i32[64]
    expected.safetensors  output.logits f32[64, 10], loss f32[] and grad.<param> for each
                          parameter (the gradient of the mean loss), the names that
                          `mgnc run ... --grads` writes.
"""

import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

SEED = 20240611
BATCH, FEATURES, HIDDEN, CLASSES = 64, 64, 128, 10
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "digits_mlp")
META = {
    "mgn.format": "1",
    "mgn.model": "DigitsMlp",
    "generator": f"scripts/make_digits_mlp_fixture.py (numpy {np.__version__}, seed {SEED})",
}


def linear_init(rng, fan_in, fan_out):
    bound = 1.0 / np.sqrt(fan_in)
    weight = rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32)
    bias = rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32)
    return weight, bias


def forward(params, x, y):
    """Logits and mean cross-entropy, in float64."""
    h_pre = x @ params["fc1.weight"].T + params["fc1.bias"]
    h = np.maximum(h_pre, 0.0)
    logits = h @ params["fc2.weight"].T + params["fc2.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(y)), y].mean()
    return logits, loss, (h_pre, h, log_probs)


def backward(params, x, y, cache):
    """Hand-derived gradients of the mean loss."""
    h_pre, h, log_probs = cache
    n = len(y)
    dlogits = np.exp(log_probs)
    dlogits[np.arange(n), y] -= 1.0
    dlogits /= n
    dh = dlogits @ params["fc2.weight"]
    dh_pre = dh * (h_pre > 0)
    return {
        "fc1.weight": dh_pre.T @ x,
        "fc1.bias": dh_pre.sum(axis=0),
        "fc2.weight": dlogits.T @ h,
        "fc2.bias": dlogits.sum(axis=0),
    }


def check_by_finite_differences(params, x, y, grads, rng):
    """Central differences on a sample of entries of every parameter must agree with `backward`."""
    eps = 1e-6
    h_pre = forward(params, x, y)[2][0]
    # A perturbation moves a pre-activation by at most eps (inputs are in [0, 1]), so no unit
    # may sit within a few eps of the ReLU kink, where differences would cross it.
    assert np.abs(h_pre).min() > 10 * eps, "a hidden unit sits on the ReLU kink; pick another seed"
    for name, p in params.items():
        flat = p.reshape(-1)
        for i in rng.choice(flat.size, size=min(flat.size, 40), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = forward(params, x, y)[1]
            flat[i] = old - eps
            down = forward(params, x, y)[1]
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            analytic = grads[name].reshape(-1)[i]
            assert abs(numeric - analytic) <= 1e-7 + 1e-5 * abs(analytic), f"{name}[{i}]: {numeric} vs {analytic}"


def main():
    train, _ = safetensors_io.load(os.path.join(ROOT, "data", "digits_train.safetensors"))
    images = train["images"][:BATCH]
    labels = train["labels"][:BATCH]
    assert images.shape == (BATCH, FEATURES) and images.dtype == np.float32
    assert labels.shape == (BATCH,) and labels.dtype == np.int32

    rng = np.random.default_rng(SEED)
    weights = {}
    weights["fc1.weight"], weights["fc1.bias"] = linear_init(rng, FEATURES, HIDDEN)
    weights["fc2.weight"], weights["fc2.bias"] = linear_init(rng, HIDDEN, CLASSES)

    # The reference works from exactly the float32 values the fixture stores.
    params = {k: v.astype(np.float64) for k, v in weights.items()}
    x = images.astype(np.float64)
    y = labels.astype(np.int64)
    logits, loss, cache = forward(params, x, y)
    grads = backward(params, x, y, cache)
    check_by_finite_differences(params, x, y, grads, np.random.default_rng(SEED + 1))

    expected = {"output.logits": logits.astype(np.float32), "loss": np.array(loss, dtype=np.float32)}
    for name in weights:
        assert grads[name].shape == weights[name].shape
        expected[f"grad.{name}"] = grads[name].astype(np.float32)

    safetensors_io.save(os.path.join(OUT, "weights.safetensors"), weights, META)
    safetensors_io.save(os.path.join(OUT, "inputs.safetensors"), {"images": images, "labels": labels}, dict(META, source="the first 64 samples of data/digits_train.safetensors"))
    safetensors_io.save(os.path.join(OUT, "expected.safetensors"), expected, dict(META, computed="NumPy float64 from the float32 weights and inputs, stored as float32; gradients of the mean loss"))
    accuracy = (logits.argmax(axis=1) == y).mean()
    print(f"loss {loss:.6f} (untrained; ln 10 = {np.log(10):.6f}), accuracy {accuracy:.3f}, |grad| {np.sqrt(sum((g ** 2).sum() for g in grads.values())):.6f}")
    for f in sorted(os.listdir(OUT)):
        print(f"{os.path.relpath(os.path.join(OUT, f), ROOT)}: {os.path.getsize(os.path.join(OUT, f))} bytes")


if __name__ == "__main__":
    main()
