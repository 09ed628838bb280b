"""The RemoteLogManager: moves segments between the local and the remote tier, and reads
the remote tier for fetches and ListOffsets. Imports storage and protocol only."""
