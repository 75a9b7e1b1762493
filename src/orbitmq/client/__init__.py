"""Producer, consumers and admin client. Talks to services only through protocol and net."""
