# frozen_string_literal: true

require "socket"
require "uri"
require "zlib"

# A stand-in for Grafana Pyroscope's ingest endpoint on 127.0.0.1, parsing
# each request as the server does (grafana/pyroscope:
# pkg/ingester/pyroscope/ingest_handler.go, api/model/labelset): POST
# /ingest; `name` is APP{k=v,...} (APP of [A-Za-z0-9_.\-/], label names of
# [A-Za-z0-9_.], values up to "," or "}", a service_name label naming the
# service); format=pprof takes the body as the profile, gzipped or not.
# behaviour: :ok (200), :error (500 with Pyroscope's JSON error),
# :unauthorized (401), :hang (reads the request and never answers, until
# stopped). With echo, the messages of :error and :unauthorized quote the
# Authorization header received (as some servers and proxies do): as Go's
# encoder writes a string (true), percent-encoded (:percent), or, for
# :error, under "error" instead of "message" (:elsewhere).
class PyroscopeReceiver
  Upload = Struct.new(:path, :params, :app, :labels, :headers, :profile, :received_at)

  attr_reader :port, :uploads, :attempts
  attr_accessor :behaviour, :echo

  def initialize(behaviour = :ok)
    @behaviour = behaviour
    @server = TCPServer.new("127.0.0.1", 0)
    @port = @server.addr[1]
    @uploads = Queue.new
    @attempts = 0
    @lock = Mutex.new
    @held = []
    @thread = Thread.new { serve }
  end

  def url
    "http://127.0.0.1:#{@port}"
  end

  # Every upload taken so far, in order.
  def all_uploads
    @taken ||= []
    @taken << @uploads.pop until @uploads.empty?
    @taken
  end

  def stop
    @thread.kill
    @thread.join(5)
    @server.close
    @lock.synchronize { @held.each { |s| s.close unless s.closed? } }
  end

  # The labelset grammar of Pyroscope's `name`: [app, {labels}]; raises
  # for what the server answers 400.
  def self.parse_name(name)
    app, rest = name.split("{", 2)
    app = app.to_s.strip
    raise ArgumentError, "service name is required" if app.empty?
    raise ArgumentError, "bad app name #{app.inspect}" unless app.match?(%r{\A[A-Za-z0-9_.\-/]+\z})

    labels = {}
    body = rest.to_s.split("}", 2).first.to_s
    body.split(",").each do |pair|
      key, value = pair.split("=", 2)
      next unless value # (a key without "=" is dropped)

      key = key.strip
      raise ArgumentError, "bad label name #{key.inspect}" unless key.match?(/\A[A-Za-z0-9_.]+\z/)

      labels[key] = value.strip
    end
    [app, labels]
  end

  private

  def serve
    loop do
      socket = @server.accept
      Thread.new(socket) { |s| handle(s) }
    end
  rescue IOError, SystemCallError
    nil
  end

  def handle(socket)
    head = +""
    head << socket.readpartial(65_536) until head.include?("\r\n\r\n")
    head, body = head.split("\r\n\r\n", 2)
    lines = head.split("\r\n")
    verb, target, = lines.shift.split(" ")
    headers = lines.to_h { |l| k, v = l.split(":", 2); [k.downcase, v.strip] }
    length = headers["content-length"].to_i
    body << socket.readpartial(65_536) while body.bytesize < length
    @lock.synchronize { @attempts += 1 }
    case @behaviour
    when :hang
      @lock.synchronize { @held << socket }
      return
    when :error
      if @echo == :elsewhere # (under another key than "message")
        return reply(socket, 500, %({"code":"internal","error":"store unavailable#{echoed(headers)}"}))
      end

      return reply(socket, 500, %({"code":"internal","message":"store unavailable#{echoed(headers)}"}))
    when :unauthorized
      return reply(socket, 401, %({"code":"unauthenticated","message":"invalid credentials#{echoed(headers)}"}))
    end
    return reply(socket, 405, "") unless verb == "POST"

    path, query = target.split("?", 2)
    return reply(socket, 404, "") unless path == "/ingest"

    params = URI.decode_www_form(query.to_s).to_h
    app, labels = PyroscopeReceiver.parse_name(params.fetch("name"))
    return reply(socket, 422, '{"message":"format"}') unless params["format"] == "pprof"

    profile = body.b.start_with?("\x1f\x8b".b) ? Zlib.gunzip(body) : body
    @uploads << Upload.new(path, params, app, labels, headers, profile, Time.now)
    reply(socket, 200, "")
  rescue ArgumentError => e
    reply(socket, 400, %({"message":"#{e.message}"}))
  rescue IOError, SystemCallError, EOFError
    nil
  ensure
    socket.close unless @behaviour == :hang || socket.closed?
  end

  def echoed(headers)
    # As Go's encoding/json (Pyroscope's) writes a string: / & < > escaped.
    return "" unless @echo
    return ": #{URI.encode_www_form_component(headers['authorization'])}" if @echo == :percent

    ": #{headers['authorization']}".gsub(%r{[/&<>]}, "/" => "\\/", "&" => "\\u0026", "<" => "\\u003c", ">" => "\\u003e")
  end

  def reply(socket, code, body)
    socket.write("HTTP/1.1 #{code} X\r\nContent-Type: application/json\r\nContent-Length: #{body.bytesize}\r\n" \
                 "Connection: close\r\n\r\n#{body}")
  end
end
