# frozen_string_literal: true

require "zlib"
require "uri"
require "securerandom"
require_relative "http_server"
require_relative "profile_file"

module Strobe
  # The HTTP side of `strobe serve`: inside the profiled process, threads of
  # Strobe's own (never profiled themselves) serve the profile collected so
  # far on 127.0.0.1 only, under a secret path:
  #
  #   GET /TOKEN/profile.json   the profile so far (a snapshot: profiling
  #                             goes on) as Firefox Profiler JSON; readable
  #                             cross-origin by https://profiler.firefox.com
  #                             only, so that its from-url/... link can load it
  #   GET /TOKEN/strobe.json    the same in Strobe's own file format (what
  #                             Strobe.save writes and `strobe report URL`
  #                             reads); not readable cross-origin
  #   GET /TOKEN/               a page linking to both and to the profiler
  #
  # TOKEN is 128 random bits, printed in the URLs only: pasted links work,
  # nothing else can guess them (any other path is 404, the token compared
  # in constant time). A request whose Host is not 127.0.0.1:PORT or
  # localhost:PORT (both name this listener and no one else's: a page from
  # another host name resolved to 127.0.0.1, DNS rebinding, has its own name
  # in Host) is refused with 403.
  #
  # The serving itself (threads, deadlines, limits, 503s, accept errors,
  # killed threads) is Strobe::HTTPServer's: a request with the wrong Host
  # or token is answered as soon as its head is in, taking no handler, and
  # slow connections never keep a new one out; each response here is written
  # within RESPONSE_TIMEOUT of the request's start, building the snapshot
  # included. Requests close together for one format share one snapshot
  # (Snapshots): building one holds the GVL, so the program pauses while it
  # is built.
  #
  # Forked children close the listening socket (in Strobe's fork handler),
  # so the port is free once this process ends. Started by
  # lib/strobe/autorun.rb when STROBE_SERVE is set (see `strobe serve
  # --help`).
  class Serve < HTTPServer
    PROFILE = "profile.json"
    STROBE_PROFILE = "strobe.json"
    # The formats served, by file name.
    FORMATS = { PROFILE => :firefox, STROBE_PROFILE => :json }.freeze
    PROFILER_ORIGIN = "https://profiler.firefox.com"
    PROFILER = "#{PROFILER_ORIGIN}/from-url/"
    TOKEN_BYTES = 16
    # The prefix of its threads' names and of its lines on stderr.
    NAME = "strobe serve"

    # A response body built once and written to any number of clients: the
    # chunks an exporter wrote (it hands over a new String each time).
    class Body
      attr_reader :bytesize

      def initialize
        @chunks = []
        @bytesize = 0
      end

      def write(data)
        data = data.b unless data.encoding == Encoding::BINARY
        @chunks << data
        @bytesize += data.bytesize
        data.bytesize
      end

      def each_chunk(&block)
        @chunks.each(&block)
      end

      # The same bytes gzipped, as another Body (zlib works without the GVL).
      def gzip
        gz = Zlib::GzipWriter.new(Body.new)
        each_chunk { |chunk| gz.write(chunk) }
        gz.finish
      end
    end

    # The profile so far in one format (:firefox or :json, Strobe's own),
    # exported once and shared by the requests for that format that come
    # while it is fresh: for FRESH seconds after it was built, and at least
    # FRESH_PER_BUILD times as long as building it took: building holds the
    # GVL, and this way a client asking in a loop pauses the program for at
    # most about a fifth of its time. One build at a time (of any format);
    # requests that come meanwhile wait for it.
    class Snapshots
      FRESH = 1.0
      FRESH_PER_BUILD = 4

      # Builds of every format.
      attr_reader :builds

      # One format's export: plain and, once asked for, gzipped.
      Export = Struct.new(:plain, :gzipped, :expires)

      def initialize(fresh: FRESH)
        @fresh = fresh
        @lock = Mutex.new
        @exports = Hash.new { |exports, format| exports[format] = Export.new(nil, nil, -Float::INFINITY) }
        @builds = 0
      end

      # The profile so far in format (gzipped if asked), a Body; nil while
      # profiling has not started.
      def fetch(format = :firefox, gzip: false)
        @lock.synchronize do
          export = @exports[format]
          build(export, format) if Serve.now >= export.expires
          next nil unless export.plain

          gzip ? (export.gzipped ||= export.plain.gzip) : export.plain
        end
      end

      private

      def build(export, format)
        export.plain = export.gzipped = nil # the old one can go while the new one is built
        export.expires = -Float::INFINITY
        started = Serve.now
        result = Strobe.snapshot
        return unless result

        body = Body.new
        if format == :firefox
          Native.export_firefox(result, nil, body)
        else
          ProfileFile.write_to(result, body, format)
        end
        export.plain = body
        @builds += 1
        finished = Serve.now
        export.expires = finished + [@fresh, FRESH_PER_BUILD * (finished - started)].max
      end
    end

    class << self
      # The Serve whose listening socket forked children close.
      attr_accessor :closing_in_children
    end

    attr_reader :token, :snapshots

    # Binds 127.0.0.1:port (0: any free port); raises SystemCallError when
    # it cannot (the port is taken). The deadlines (seconds) and how long a
    # snapshot stays fresh can be changed (tests do).
    def initialize(port, err: $stderr, request_timeout: REQUEST_TIMEOUT, response_timeout: RESPONSE_TIMEOUT,
                   fresh: Snapshots::FRESH)
      seconds(:request_timeout, request_timeout) # all checked before the port is bound
      seconds(:response_timeout, response_timeout)
      fresh = seconds(:fresh, fresh)
      super("127.0.0.1", port, name: NAME, err: err,
            request_timeout: request_timeout, response_timeout: response_timeout)
      @token = SecureRandom.hex(TOKEN_BYTES)
      @hosts = ["127.0.0.1:#{@port}", "localhost:#{@port}"].freeze
      @snapshots = Snapshots.new(fresh: fresh)
      Native.close_in_children(@server.fileno)
      Serve.closing_in_children = self
    rescue StandardError
      @server&.close
      raise
    end

    # The page linking to the profile and to the profiler.
    def page_url
      "http://127.0.0.1:#{@port}/#{@token}/"
    end

    # The Firefox Profiler JSON.
    def url
      "#{page_url}#{PROFILE}"
    end

    # Strobe's own file format.
    def strobe_url
      "#{page_url}#{STROBE_PROFILE}"
    end

    def profiler_url
      "#{PROFILER}#{URI.encode_www_form_component(url)}"
    end

    # Stops serving: the threads end, the port is closed, and forked
    # children no longer replace its descriptor (a file may reuse it).
    def stop
      super
    ensure
      if Serve.closing_in_children.equal?(self)
        Native.close_in_children(nil)
        Serve.closing_in_children = nil
      end
    end

    private

    # The writer of a response: due RESPONSE_TIMEOUT after the request is
    # taken up, building the snapshot included.
    def writer(socket)
      DeadlineWriter.new(socket, Serve.now + @response_timeout)
    end

    # Answered at once by the accepting thread, never reaching a handler: a
    # request for another Host (403) or not under the token (404).
    def screen(request)
      unless @hosts.include?(request.header("host").to_s.downcase)
        return [403, "this server answers requests for 127.0.0.1:#{@port} only\n"]
      end

      token = request.path.split("/", 3)[1]
      [404, "not found\n"] unless token && Serve.secure_equal?(token, @token)
    end

    # Answers a request for this listener under the token (screen saw both).
    def route(request, out)
      rest = request.path.split("/", 3)[2]
      case [request.verb, rest.to_s]
      in ["GET", PROFILE | STROBE_PROFILE] then send_profile(out, request, FORMATS.fetch(rest))
      in ["GET", ""] then respond(out, 200, index_page, type: "text/html; charset=utf-8")
      in ["OPTIONS", _] then respond(out, 204, "", extra: cors(request, preflight: true))
      in ["GET", _] then respond(out, 404, "not found: #{url} and #{strobe_url} have the profile\n")
      else respond(out, 405, "only GET\n", extra: ["Allow: GET, OPTIONS"])
      end
    end

    # The profile so far in format; only the Firefox export is for the
    # Firefox Profiler's page to read.
    def send_profile(out, request, format)
      gzip = request.header("accept-encoding").to_s.split(",").any? { |e| e.strip.start_with?("gzip") }
      body = @snapshots.fetch(format, gzip: gzip)
      return respond(out, 503, "no profile: profiling has not started\n") unless body

      extra = format == :firefox ? cors(request) : []
      extra << "Content-Encoding: gzip" if gzip
      out.write(head(200, "application/json", body.bytesize, extra))
      body.each_chunk { |chunk| out.write(chunk) }
    end

    # The CORS headers: only the Firefox Profiler may read the profile from
    # another origin (its from-url fetch), and it is named, never `*`.
    def cors(request, preflight: false)
      lines = ["Vary: Origin"]
      return lines unless request.header("origin") == PROFILER_ORIGIN

      lines << "Access-Control-Allow-Origin: #{PROFILER_ORIGIN}"
      if preflight
        lines << "Access-Control-Allow-Methods: GET"
        # Chrome's private network access: a public page asking for 127.0.0.1
        lines << "Access-Control-Allow-Private-Network: true" if request.header("access-control-request-private-network")
      end
      lines
    end

    def index_page
      <<~HTML
        <!DOCTYPE html>
        <html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
        <title>Strobe: profile of #{Process.pid}</title></head>
        <body><h1>Strobe is profiling process #{Process.pid}</h1>
        <p><a href="#{profiler_url}">Open the profile so far in the Firefox Profiler</a>
        (it fetches <a href="#{url}">#{url}</a>).</p>
        <p>The profile so far in Strobe's own file format: <a href="#{strobe_url}">#{strobe_url}</a>
        (<code>strobe report #{strobe_url}</code>).</p></body></html>
      HTML
    end
  end
end
