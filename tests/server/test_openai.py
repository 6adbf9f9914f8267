"""The official `openai` client against /v1: chat and completions, plain and streaming, equal to the
in-process Engine's greedy output for the same prompt (chat: the checkpoint's template rendered here)."""

from __future__ import annotations

import datetime
import json

import jinja2
import openai
import pytest

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello server!"}]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_ids(reference, model_dir, messages: list[dict] = MESSAGES) -> list[int]:
    """The prompt the server should build: tokenizer_config.json's template rendered here with plain jinja2
    (HF's settings), tokenized without added special tokens."""
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    text = env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=reference.tokenizer.bos_token or "",
        eos_token=reference.tokenizer.eos_token or "")
    return reference.tokenizer.encode(text, add_special_tokens=False)


def test_completions(oai, reference, model_dir):
    out = oai.completions.create(model="any", prompt="The quick brown fox", max_tokens=9, temperature=0)
    text, ids = reference.generate("The quick brown fox", 9)
    assert out.object == "text_completion" and out.choices[0].text == text
    assert out.usage.completion_tokens == len(ids)
    assert out.choices[0].finish_reason in ("length", "stop")
    default = oai.completions.create(model="any", prompt=[1, 2, 3], temperature=0)  # OpenAI's max_tokens 16
    assert default.usage.completion_tokens == len(reference.generate([1, 2, 3], 16)[1])


def test_completions_stream(oai, reference):
    stream = oai.completions.create(model="any", prompt="Hello world", max_tokens=8, temperature=0,
                                    stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == reference.generate("Hello world", 8)[0]
    assert chunks[-1].choices[0].finish_reason is not None
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat(oai, reference, model_dir):
    out = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=10, temperature=0)
    text, ids = reference.generate(chat_ids(reference, model_dir), 10)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == text
    assert out.usage.prompt_tokens == len(chat_ids(reference, model_dir))
    assert out.usage.completion_tokens == len(ids)


def test_chat_stream_with_usage(oai, reference, model_dir):
    stream = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=10, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    text, ids = reference.generate(chat_ids(reference, model_dir), 10)
    assert content == text
    assert chunks[-1].usage.completion_tokens == len(ids) and not chunks[-1].choices


def test_bad_requests_raise_bad_request_error(oai):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        oai.completions.create(model="any", prompt="x", max_tokens=2, top_p=0)
    with pytest.raises(openai.BadRequestError, match="n"):
        oai.completions.create(model="any", prompt="x", max_tokens=2, n=65)
    with pytest.raises(openai.BadRequestError, match="messages"):
        oai.chat.completions.create(model="any", messages=[], max_tokens=2)


def test_sampled_and_penalised_requests_on_the_speculative_server(oai, reference):
    """OpenAI's defaults sample (temperature 1): the EAGLE-3 server serves them by rejection sampling. A
    fixed seed reproduces the output exactly (the in-process engine with the same seed gives it too);
    another seed gives another; a penalised greedy request equals the engine's."""
    kwargs = dict(model="any", prompt="The quick brown fox", max_tokens=24, extra_body={"ignore_eos": True})
    first = oai.completions.create(**kwargs, seed=7)
    again = oai.completions.create(**kwargs, seed=7)
    other = [oai.completions.create(**kwargs, seed=s).choices[0].text for s in (8, 9, 10)]
    assert first.choices[0].text == again.choices[0].text
    assert any(text != first.choices[0].text for text in other)
    text, _ = reference.generate("The quick brown fox", 24, temperature=1.0, seed=7, ignore_eos=True)
    assert first.choices[0].text == text
    penalised = oai.completions.create(**kwargs, temperature=0, frequency_penalty=1.2, presence_penalty=0.5)
    text, _ = reference.generate("The quick brown fox", 24, frequency_penalty=1.2, presence_penalty=0.5,
                                 ignore_eos=True)
    assert penalised.choices[0].text == text
    assert penalised.choices[0].text != oai.completions.create(**kwargs, temperature=0).choices[0].text
