"""homing's admin API (`homing.v1.Admin`, proto/homing/v1/admin.proto).

Modules: `server` (the `AdminServer` the gateway process runs on its Unix socket and,
optionally, TCP), `client` (`AdminClient` and address resolution), `commands` (the
`homing workers|models|tenants|stats` verbs). Nothing is imported here, so the CLI verbs
load only the client side.
"""
