"""The batch engine: device selection, op chains, codecs and the pipelined executor."""
