"""Lua that the nginx traffic router puts in an LLM route's configuration where nginx loads
its Lua module (``fleet.adapters.routers.nginx_conf``, ``token_timing``). Plain text: no
Django, nothing from ``local``."""

# The body filter of an LLM route's streamed answers (token timing: see nginx_conf's docstring).
# It keeps the last bytes of the previous chunk, so an event or a usage split across two
# chunks is still seen, and counts each event once.
TOKEN_TIMING_LUA = r"""
local ctx = ngx.ctx
if ctx.sy_sse == nil then
    local kind = ngx.header.content_type
    ctx.sy_sse = kind ~= nil and string.find(string.lower(kind), "text/event-stream", 1, true) ~= nil
    ctx.sy_tail, ctx.sy_tail_events, ctx.sy_events = "", 0, 0
end
local chunk = ngx.arg[1]
if not ctx.sy_sse or chunk == "" then
    return
end
local text = ctx.sy_tail .. chunk
local _, events = string.gsub(text, "data: {", "")
local added = events - ctx.sy_tail_events
if added > 0 then
    if ctx.sy_events == 0 then
        ngx.update_time()
        ngx.var.sy_first_token = string.format("%.3f", ngx.now() - ngx.req.start_time())
    end
    ctx.sy_events = ctx.sy_events + added
end
local used = string.match(text, '"completion_tokens":%s*(%d+)')
if used then
    ctx.sy_used = used
end
if ctx.sy_events > 0 then
    ngx.var.sy_tokens = ctx.sy_used or tostring(ctx.sy_events)
end
ctx.sy_tail = string.sub(text, -48)
local _, kept = string.gsub(ctx.sy_tail, "data: {", "")
ctx.sy_tail_events = kept
"""
