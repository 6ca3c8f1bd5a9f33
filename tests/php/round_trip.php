<?php
// php-amqplib (Debian's php-amqplib) against a Warren node: publisher confirms, consume with prefetch and
// acks, a table header round trip, a mandatory return, then a 404 on a passive declare that closes only
// the channel. Prints what it saw as one JSON object. Usage: php round_trip.php PORT QUEUE
require_once 'PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Exception\AMQPProtocolChannelException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

[, $port, $queue] = $argv;
$connection = new AMQPStreamConnection('127.0.0.1', (int) $port, 'guest', 'guest', '/', false, 'AMQPLAIN', null,
                                       'en_US', 5.0, 5.0);
$channel = $connection->channel();
$channel->queue_declare($queue, false, true, false, false);

$acked = [];
$returned = [];
$channel->confirm_select();
$channel->set_ack_handler(function (AMQPMessage $message) use (&$acked) { $acked[] = $message->getBody(); });
$channel->set_return_listener(function ($code, $text, $exchange, $key, AMQPMessage $message) use (&$returned) {
    $returned[] = ['code' => $code, 'text' => $text, 'key' => $key, 'body' => $message->getBody()];
});
for ($i = 0; $i < 20; $i++) {
    $message = new AMQPMessage("php $i", [
        'delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT, 'content_type' => 'text/plain',
        'application_headers' => new AMQPTable(['i' => $i, 'tags' => ['a', 'b'], 'nested' => ['k' => 'v']]),
    ]);
    $channel->basic_publish($message, '', $queue);
}
$channel->basic_publish(new AMQPMessage('lost'), '', "$queue.nowhere", true);
$channel->wait_for_pending_acks_returns(5.0);

$received = [];
$channel->basic_qos(0, 5, false);
$channel->basic_consume($queue, '', false, false, false, false, function (AMQPMessage $message) use (&$received) {
    $headers = $message->get('application_headers')->getNativeData();
    $received[] = ['body' => $message->getBody(), 'i' => $headers['i'], 'tags' => $headers['tags'],
                   'nested' => $headers['nested'], 'persistent' => $message->get('delivery_mode') === 2,
                   'content_type' => $message->get('content_type')];
    $message->ack();
});
while (count($received) < 20) {
    $channel->wait(null, false, 5.0);
}

$failing = $connection->channel();
$error = null;
try {
    $failing->queue_declare("$queue.missing", true);
} catch (AMQPProtocolChannelException $e) {
    $error = ['code' => $e->getCode(), 'message' => $e->getMessage()];
}
[, $left] = $channel->queue_declare($queue, true);
$channel->queue_delete($queue);
echo json_encode(['acked' => $acked, 'returned' => $returned, 'received' => $received, 'error' => $error,
                  'left' => $left, 'connected' => $connection->isConnected()]), "\n";
$channel->close();
$connection->close();
