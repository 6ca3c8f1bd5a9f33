"""What every protocol front end's connections share, written once.

``front_end.FrontEnd`` (the pre-login pool, reads held for named reasons, bounded frames per turn, throttled
complaints) and ``ClientConnection``, through which the HTTP API lists connections; ``clients.Clients``, the node's
client connections and their pending output; ``auth_mechanisms``, the SASL logins of AMQP 0-9-1 and AMQP 1.0;
``stored_bodies``, how both send a large stored body (from the store's file) and let go of it once sent.
"""
