"""The APIs' content: request schemas, chat rendering through the model's template, tool calls,
reasoning, constraints, errors, stop strings, the Responses API's store, prompts rendered and tokenized off the loop."""
