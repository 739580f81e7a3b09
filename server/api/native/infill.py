"""POST /infill: llama-server's fill-in-the-middle completion, which code editors call
(llama.vscode, llama.vim) with the text before and after the cursor.

The body is /completion's without `prompt` as the whole prompt: `input_prefix` and
`input_suffix` (required: text, or texts and token ids mixed), `input_extra` (other files:
`[{"filename", "text"}]`), `prompt` (what was typed after the prefix on the cursor's line),
and /completion's other fields (`n_predict`, sampling, `stream`, `n_indent`,
`t_max_predict_ms`, ...). The prompt is laid out from the model's FIM tokens
(server/prompt/infill.py); generation, the reply and its stream are /completion's. A model
whose vocabulary has no FIM tokens answers 400. llama-server has no /v1/infill, nor does
this server.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...errors import InvalidRequest
from ...prompt.infill import Budget, infill_tokens, parse_infill
from ...state import open_request
from .route import complete

FIM_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt")


async def infill(request: Request) -> Response:
    host, key, body = await open_request(request)
    vocab = host.engine.vocab
    missing = vocab.fim.missing()
    if missing:
        raise InvalidRequest(
            f"infill is not supported by this model: its vocabulary has no FIM {', '.join(missing)} token "
            "(a code model with fill-in-the-middle tokens is needed)",
            code="infill_not_supported",
        )
    fields = parse_infill(body, vocab.n_vocab)
    budget = Budget(host.config.engine.n_batch, host.engine.info.n_ctx_slot, host.config.n_predict)
    tokens = await host.server.offload(infill_tokens, vocab, fields, budget, host.config.spm_infill, request=request)
    rest = {name: value for name, value in body.items() if name not in FIM_FIELDS}
    return await complete(request, host, key, {**rest, "prompt": tokens}, "infill")
