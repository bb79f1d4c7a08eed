"""Process guards: what keeps code we did not write from taking a run down.

    sandbox.py        run untrusted Python (the code verifier, agent tools) in a limited child process
    sandbox_child.py  what that child does first: namespaces, resource limits, then the program
    processes.py      helper processes that die with the process that started them
    timed_calls.py    calls with a time limit (users' reward functions, external graders)

Nothing here imports the rest of posttrain: the math worker and the sandbox's child load these
files by path, in interpreters where the package may not be importable.
"""
