"""What every layer uses: fork safety, redaction of secrets, the process's CPUs and
memory, shutdown hooks. Imports nothing of iolib but errors."""
