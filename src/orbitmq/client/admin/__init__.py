"""The admin client, split by what it administers.

- :mod:`.base`: connections, the route cache, requests to one broker or every master;
- :mod:`.topics`: cluster, topics, queues, offsets, pulls, message lookups;
- :mod:`.groups`: consumer groups, group configs, dead-letter queues;
- :mod:`.client`: the async client (both of the above) and the blocking one;
- :mod:`.types`: what they return.

Import names from their modules (or from :mod:`orbitmq.client`); this package imports nothing.
"""
