"""gpt-oss MoE layer: routing, clamped SwiGLU, both dispatch strategies, parity with HF GptOssMLP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxserve.layers.moe import GptOssMoE, clamped_swiglu, route

H, INTER, E, K = 16, 8, 4, 2
PARAMS = ("router_weight", "router_bias", "gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def _random_moe(dispatch: str, seed: int = 0, scale: float = 1.0) -> GptOssMoE:
    rng = np.random.default_rng(seed)
    moe = GptOssMoE(H, INTER, E, K, swiglu_limit=7.0, swiglu_alpha=1.702, dispatch=dispatch)
    for name in PARAMS:
        p = getattr(moe, name)
        p[...] = jnp.asarray(rng.normal(scale=scale, size=p.shape).astype(np.float32))
    return moe


def _numpy_moe(x, moe: GptOssMoE, limit=7.0, alpha=1.702):
    """Per-token, per-expert loop in float64: an independent brute-force model of the spec."""
    w_r, b_r, gu_w, gu_b, d_w, d_b = (np.asarray(getattr(moe, n)[...], np.float64) for n in PARAMS)
    out = np.zeros_like(x, dtype=np.float64)
    for t, row in enumerate(np.asarray(x, np.float64)):
        logits = w_r @ row + b_r
        chosen = np.argsort(-logits)[:K]
        p = np.exp(logits[chosen] - logits[chosen].max())
        p /= p.sum()
        for weight, e in zip(p, chosen, strict=True):
            gu = row @ gu_w[e] + gu_b[e]
            gate, up = np.minimum(gu[0::2], limit), np.clip(gu[1::2], -limit, limit)
            h = (up + 1) * gate / (1 + np.exp(-alpha * gate))
            out[t] += weight * (h @ d_w[e] + d_b[e])
    return out


def test_route_softmax_is_over_the_selected_logits_only():
    x = jnp.eye(3, dtype=jnp.float32)
    w = jnp.array([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [0.5, 0.5, 0.5]])
    weights, experts = route(x, w, jnp.zeros(4), top_k=2)
    # token 0: logits [1, 0, 0, .5] -> experts 0 then 3, softmax([1, .5])
    assert experts[0].tolist() == [0, 3]
    np.testing.assert_allclose(weights[0], jax.nn.softmax(jnp.array([1.0, 0.5])), rtol=1e-6)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_clamped_swiglu_interleaves_and_clamps():
    # columns: gate0, up0, gate1, up1
    gu = jnp.array([[10.0, -20.0, -3.0, 20.0]])
    got = clamped_swiglu(gu, limit=7.0, alpha=1.702)
    gate = np.array([7.0, -3.0])  # gate clamped above only: -3 stays
    up = np.array([-7.0, 7.0])
    want = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
    np.testing.assert_allclose(np.asarray(got)[0], want, rtol=1e-6)


@pytest.mark.parametrize("dispatch", ["dense", "sorted"])
def test_moe_matches_bruteforce_reference(dispatch):
    moe = _random_moe(dispatch, seed=1, scale=0.7)  # large enough that some activations hit the clamp
    x = np.random.default_rng(2).normal(size=(2, 9, H)).astype(np.float32)
    got = np.asarray(moe(jnp.asarray(x))).reshape(-1, H)
    want = _numpy_moe(x.reshape(-1, H), moe)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_dispatch_strategies_agree_under_jit():
    dense, sorted_ = _random_moe("dense", seed=3), _random_moe("sorted", seed=3)
    x = jnp.asarray(np.random.default_rng(4).normal(size=(33, H)).astype(np.float32))
    fwd = nnx.jit(lambda m, v: m(v))
    np.testing.assert_allclose(np.asarray(fwd(dense, x)), np.asarray(fwd(sorted_, x)), rtol=1e-5, atol=1e-5)


def test_auto_dispatch_resolves_per_platform():
    want = "dense" if jax.default_backend() == "cpu" else "sorted"
    assert GptOssMoE(H, INTER, E, K).dispatch == want


def test_rejects_bad_top_k_and_dispatch():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        GptOssMoE(H, INTER, E, top_k=E + 1)
    with pytest.raises(ValueError, match="dispatch"):
        GptOssMoE(H, INTER, E, K, dispatch="loop")


@pytest.mark.hf
@pytest.mark.parametrize("dispatch", ["dense", "sorted"])
def test_moe_matches_transformers_gpt_oss_mlp(dispatch):
    import torch
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    cfg = GptOssConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=K)
    cfg._experts_implementation = "eager"
    hf = GptOssMLP(cfg).eval()
    moe = _random_moe(dispatch, seed=5, scale=0.7)
    with torch.no_grad():
        hf.router.weight.copy_(torch.from_numpy(np.array(moe.router_weight[...])))
        hf.router.bias.copy_(torch.from_numpy(np.array(moe.router_bias[...])))
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            getattr(hf.experts, name).copy_(torch.from_numpy(np.array(getattr(moe, name)[...])))
        x = np.random.default_rng(6).normal(size=(2, 7, H)).astype(np.float32)
        want = hf(torch.from_numpy(x))[0].numpy()
    got = np.asarray(moe(jnp.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
