"""The frozen target: loaded truncated, its packed forward, preflight, the whole target, the tiny
local targets."""
