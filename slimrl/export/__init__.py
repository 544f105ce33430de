"""Getting a trained model out: merged weights, GGUF for llama.cpp / Ollama, the Hugging Face Hub."""
