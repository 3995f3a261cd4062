"""Every click command of ``run`` except the task commands' factory (runner/cli.py): what each
subcommand parses and prints. The packages beside this one do the work; a command only calls them.
"""
