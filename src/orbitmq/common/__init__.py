"""Message model, ids, response codes and the one exception hierarchy shared by every layer."""
