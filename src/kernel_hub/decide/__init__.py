"""Pure decisions, each a function of the system it is handed: which version a spec means, which build variant
fits this machine, what a builder name promises, what this machine is. Nothing here downloads or imports a kernel."""
