"""Building blocks of the decoder: norm, rotary, attention, MLP, embedding and LM head."""
