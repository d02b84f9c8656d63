"""Model-side conventions every tier shares: the chat format, the tool-call syntax."""
