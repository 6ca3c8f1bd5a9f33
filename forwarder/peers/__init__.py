"""The other nodes of the cluster and the links to them.

``node_link``: the authenticated node-to-node links; ``peer.Peer``: another node as this one sees it;
``owner_side``: the owner's side of a link (publishes into its queues, consumers on behalf of other nodes);
``remote_queue.RemoteQueue``: a queue another node owns, as this node's routing and consumers see it.
"""
