"""Kernel repos on a Hub endpoint, through huggingface_hub only, in one module per job: `client` (every request),
`cache` (kernel-hub's state in the Hub cache), `listing` (what a commit publishes under build/), `download`
(fetching and checking one build), `builder` (the kernel-builder dialect's files) and `source` (HubSource, the
Source protocol composing them)."""
