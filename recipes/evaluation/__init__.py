"""The evaluation stage's GPU side: lm-evaluation-harness on a Hugging Face model (harness.py), the held-out
perplexity task it runs on the user's files (tasks.py), the tasks' data prepared on a machine with internet
(fetch.py); the trainer's own loss over named blends is recipes/trainer/heldout.py. `python -m
recipes.evaluation` is the command line."""
