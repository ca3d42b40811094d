"""Drive duet through Envoy with the official OpenAI Python SDK.

Usage: python openai_client.py BASE_URL
Prints one JSON object with what the SDK received; the Go test checks it.
"""
import json
import sys

from openai import OpenAI


def main() -> None:
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=30)
    out = {}

    chat = client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
    )
    out["chat"] = {"content": chat.choices[0].message.content, "usage": chat.usage.model_dump()}

    chunks = []
    stream = client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage.model_dump()
    out["chat_stream"] = {"chunks": chunks, "usage": usage}

    comp = client.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=5)
    out["completions"] = {"text": comp.choices[0].text, "usage": comp.usage.model_dump()}

    try:
        client.chat.completions.create(model="sim-model", messages="not a list", max_tokens=2, n=0)
        out["error"] = None
    except Exception as exc:  # the SDK raises BadRequestError for a 400
        out["error"] = {"type": type(exc).__name__, "status": getattr(exc, "status_code", None)}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
