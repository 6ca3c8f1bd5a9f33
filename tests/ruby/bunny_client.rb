# Bunny (Debian's ruby-bunny) against a Warren node, as Bunny's own specs drive a broker: an ack with a tag
# that is not outstanding, and connection recovery after the node closes the connection, also while the
# application closes it during the recovery's handshake (when Bunny sends a stale channel.close on the new
# socket before connection.open). Prints what it saw as one JSON object.
# Usage: ruby bunny_client.rb AMQP_PORT MGMT_PORT NAME
require "bunny"
require "json"
require "logger"
require "net/http"
require "uri"

port, mgmt, name = Integer(ARGV[0]), Integer(ARGV[1]), ARGV[2]
LOGGER = Logger.new($stderr).tap { |logger| logger.level = Logger::ERROR }

def api(mgmt, method, path)
  request = (method == :get ? Net::HTTP::Get : Net::HTTP::Delete).new(path)
  request.basic_auth("guest", "guest")
  response = Net::HTTP.start("127.0.0.1", mgmt) { |http| http.request(request) }
  method == :get ? JSON.parse(response.body) : response.code
end

def connections(mgmt, name)
  api(mgmt, :get, "/api/connections").select { |c| c.dig("client_properties", "connection_name") == name }
end

def close_connections(mgmt, name)
  connections(mgmt, name).each do |c|
    api(mgmt, :delete, "/api/connections/" + URI.encode_www_form_component(c["name"]).gsub("+", "%20"))
  end
end

def poll_until(timeout = 10)
  deadline = Time.now + timeout
  until yield
    return false if Time.now > deadline
    sleep 0.05
  end
  true
end

def session(port, name)
  Bunny.new(host: "127.0.0.1", port: port, network_recovery_interval: 0.2, recover_from_connection_close: true,
            client_properties: { connection_name: name }, logger: LOGGER).tap(&:start)
end

result = {}

# basic_ack_spec.rb: "with an invalid (random) delivery tag causes a channel-level error"
c = session(port, name)
ch = c.create_channel
q = ch.queue("", exclusive: true)
ch.default_exchange.publish("bunneth", routing_key: q.name)
poll_until { q.message_count == 1 }
ch.on_error { |_, close| result["ack_error"] = { "code" => close.reply_code, "text" => close.reply_text } }
ch.basic_get(q.name, manual_ack: true)
ch.ack(82, true)
poll_until(2) { result.key?("ack_error") }
result["ack_channel_open"] = ch.open?
c.close

# connection_recovery_spec.rb: channels and consumers come back after the node closes the connection
c = session(port, name)
recoveries = Queue.new
c.after_recovery_completed { recoveries << true }
ch1, ch2 = c.create_channel, c.create_channel
ch1.confirm_select
q = ch1.queue("", exclusive: true)
delivered = []
q.subscribe { |_, _, body| delivered << body }
poll_until { connections(mgmt, name).size == 1 }
close_connections(mgmt, name)
result["recovered"] = poll_until { !recoveries.empty? } && ch1.open? && ch2.open? && c.open? &&
                      connections(mgmt, name).size == 1
q.publish("after recovery")
ch1.wait_for_confirms
result["consumer_recovered"] = poll_until { delivered == ["after recovery"] }
c.close

# the application closes the connection while Bunny recovers it: nothing may be left behind
leftover = []
[0.2, 0.3].each do |delay|
  c = session(port, name)
  c.create_channel
  close_connections(mgmt, name)
  sleep delay
  begin
    c.close(false)
  rescue StandardError
    nil
  end
  sleep 3.5  # past the node's wait for close-ok
  leftover << connections(mgmt, name).size
end
result["left_after_close_during_recovery"] = leftover
puts JSON.generate(result)
